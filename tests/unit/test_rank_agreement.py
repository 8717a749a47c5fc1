"""SavePlans: ranks that each want a save (or a stop) at their own moment act at one step, planned
through a key-value store. The store here is a dict with the same four operations; the real
torch.distributed store is used by tests/chaos/test_rank_agreement.py."""

from __future__ import annotations

from trainguard.checkpoint.agreement import POLL_S, SavePlans, job_namespace


class DictStore:
    """check/get/compare_set/add with TCPStore's meaning."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.reads = 0

    def check(self, keys: list[str]) -> bool:
        self.reads += 1
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if key not in self.data and expected == "":
            self.data[key] = desired.encode()
        return self.data[key]

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lockstep(ranks: list[SavePlans], clock: Clock, steps: range, wants) -> dict[int, list[tuple[int, int]]]:
    """Every rank calls at every step (10 ms a step); ``wants(rank, step)`` -> (wanted, stop)."""
    acted: dict[int, list[tuple[int, int]]] = {r: [] for r in range(len(ranks))}
    for step in steps:
        clock.now += 0.01
        for rank, plans in enumerate(ranks):
            wanted, stop = wants(rank, step)
            if plan := plans.due(step, wanted=wanted, stop=stop):
                acted[rank].append((step, plan.stop))
    return acted


def test_ranks_that_want_a_save_at_different_steps_save_one_step_together() -> None:
    store, clock = DictStore(), Clock()
    ranks = [SavePlans(store, "job", 3, clock) for _ in range(3)]
    # Each rank's own clock says the save is due at another step (40, 47, 55), until it has saved.
    due_at = {0: 40, 1: 47, 2: 55}
    saved: dict[int, bool] = {0: False, 1: False, 2: False}

    acted: dict[int, list[int]] = {r: [] for r in range(3)}
    for step in range(400):
        clock.now += 0.01
        for rank, plans in enumerate(ranks):
            if plans.due(step, wanted=step >= due_at[rank] and not saved[rank]):
                acted[rank].append(step)
                saved[rank] = True
    assert acted[0] == acted[1] == acted[2] and len(acted[0]) == 1, acted
    # Far enough ahead that a rank reading the store only every POLL_S still gets there in time.
    assert acted[0][0] - 40 >= POLL_S / 0.01
    assert all(p.late == 0 for p in ranks)


def test_a_signal_that_reaches_one_rank_stops_every_rank_at_one_step_with_that_signal() -> None:
    store, clock = DictStore(), Clock()
    ranks = [SavePlans(store, "job", 2, clock) for _ in range(2)]
    acted = lockstep(ranks, clock, range(300), lambda rank, step: (rank == 1 and step >= 30, 15 if rank == 1 else 0))
    first = {rank: found[0] for rank, found in acted.items()}
    assert first[0] == first[1] and first[0][1] == 15, acted


def test_ranks_read_the_store_about_once_per_poll_period_not_every_step() -> None:
    store, clock = DictStore(), Clock()
    plans = SavePlans(store, "job", 1, clock)
    for step in range(1000):  # 10 s at 10 ms a step, nothing wanted
        clock.now += 0.01
        plans.due(step, wanted=False)
    assert store.reads <= 10 / POLL_S + 5


def test_members_count_the_ranks_that_joined() -> None:
    store = DictStore()
    first, second = SavePlans(store, "job", 2, rank=0), SavePlans(store, "job", 2, rank=1)
    assert first.join() == 1 and first.members() == 1
    second.join()
    assert first.members() == 2
    assert SavePlans(store, "another name", 2).members() == 0


def test_a_store_that_outlived_a_launch_never_replays_its_plans() -> None:
    """A file store reused by the next launch (init_method=file://): the old launch's stop stays its own."""
    store, clock = DictStore(), Clock()
    old = [SavePlans(store, "job", 2, clock, rank=r) for r in range(2)]
    for plans in old:
        plans.join()
    lockstep(old, clock, range(100), lambda rank, step: (rank == 1 and step >= 30, 15))  # stopped by SIGTERM
    new = [SavePlans(store, "job", 2, clock, rank=r) for r in range(2)]
    assert [plans.join() for plans in new] == [1, 2]
    acted = lockstep(new, clock, range(90, 200), lambda rank, step: (False, 0))  # resumed; no signal
    assert acted == {0: [], 1: []}


def test_slow_steps_get_a_plan_for_the_next_step() -> None:
    """3 s steps: every rank reads the store at every call, so a stop waits one step, not three."""
    store, clock = DictStore(), Clock()
    ranks = [SavePlans(store, "job", 2, clock) for _ in range(2)]
    acted: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for step in range(12):
        clock.now += 3.0
        for rank, plans in enumerate(ranks):
            if plan := plans.due(step, wanted=step >= 6, stop=15):
                acted[rank].append((step, plan.stop))
    assert acted[0][0] == acted[1][0] == (7, 15)


def test_a_launch_where_only_rank_0_joined_never_hands_its_stop_to_the_next_launch() -> None:
    """`if rank == 0: ckpt = Checkpointer(...)` on a store that outlives its launch: the next launch's
    rank 0 counts a launch of its own (counting every rank together, it took the old launch's keys
    and replayed the old stop at once)."""
    store, clock = DictStore(), Clock()
    old = SavePlans(store, "job", 2, clock, rank=0)
    old.join()
    lockstep([old], clock, range(100), lambda rank, step: (step >= 30, 15))
    new = SavePlans(store, "job", 2, clock, rank=0)
    new.join()
    assert lockstep([new], clock, range(100, 200), lambda rank, step: (False, 0)) == {0: []}


def _node(attempt: str, restarts: str) -> dict[str, str]:
    return {"TORCHELASTIC_RUN_ID": "exp-7", "TRAINGUARD_ATTEMPT": attempt, "TORCHELASTIC_RESTART_COUNT": restarts,
            "TRAINGUARD_RUN_ID": f"run-of-this-node-{attempt}"}  # fmt: skip


def test_nodes_whose_attempts_and_restarts_were_counted_apart_share_one_namespace() -> None:
    """Node 0 ended peer_failure and was restarted by its trainguard (attempt 2, its torchrun's agent
    restarted once), node 1 started fresh (attempt 1): one launch, one set of plans (issue 19.7)."""
    restarted, fresh = _node("2", "1"), _node("1", "0")
    assert job_namespace("ckpt", 2, 0, restarted) == job_namespace("ckpt", 2, 0, fresh)
    assert job_namespace("ckpt", 2, 0, fresh) != job_namespace("ckpt", 2, 1, fresh)  # a second Checkpointer
    assert job_namespace("ckpt", 2, 0, fresh) != job_namespace("ckpt", 2, 0, {**fresh, "TORCHELASTIC_RUN_ID": "x"})


def test_ranks_of_two_nodes_with_different_attempts_plan_one_stop_together() -> None:
    store, clock = DictStore(), Clock()
    ranks = [SavePlans(store, job_namespace("ckpt", 2, 0, env), 2, clock, rank=r)
             for r, env in enumerate((_node("2", "1"), _node("1", "0")))]  # fmt: skip
    assert [plans.join() for plans in ranks] == [1, 2]
    assert ranks[0].members() == 2  # before: 1 each ("only 1 of the job's 2 ranks made a Checkpointer")
    acted = lockstep(ranks, clock, range(300), lambda rank, step: (rank == 1 and step >= 30, 15))
    assert acted[0] and acted[0][0] == acted[1][0] and acted[0][0][1] == 15, acted
