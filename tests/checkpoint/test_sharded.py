"""Checkpoints of a job of several ranks in one shared folder: a step counts once every rank's shard is
in place, every rank resumes from that step with its own state, a dead attempt's shards never complete
a later attempt's step, and a damaged shard sends every rank back to the previous step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainguard import Checkpointer, CheckpointError
from trainguard.checkpoint import layouts


def ranks(folder: Path, world_size: int = 2, **kwargs) -> list[Checkpointer]:
    return [
        Checkpointer(folder, rank=r, world_size=world_size, handle_signals=False, **kwargs) for r in range(world_size)
    ]


def close(checkpointers: list[Checkpointer]) -> None:
    for ckpt in checkpointers:
        ckpt.close()


def state(rank: int, step: int) -> dict:
    return {"step": step, "rank": rank, "w": torch.full((4,), float(rank * 100 + step))}


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_step_is_complete_only_when_every_rank_saved_it(tmp_path: Path, asynchronous: bool) -> None:
    zero, one = ranks(tmp_path, asynchronous=asynchronous)
    zero.save(state(0, 5), 5)
    zero.wait()
    found = layouts.scan(tmp_path)
    assert [c.step for c in found] == [5] and not found[0].complete
    assert "not every rank finished" in found[0].problems[0]
    assert zero.load_latest() is None  # rank 1 has not saved step 5: no rank may resume from it
    one.save(state(1, 5), 5)
    one.wait()
    assert layouts.newest_complete(tmp_path).path == str(tmp_path / "step-000000000005")
    job = json.loads((tmp_path / "step-000000000005" / "job.json").read_text())
    assert job["world_size"] == 2 and sorted(job["shards"]) == ["rank-00000", "rank-00001"]
    assert zero.load_latest()["rank"] == 0 and one.load_latest()["rank"] == 1
    assert torch.equal(one.load_latest()["w"], torch.full((4,), 105.0))
    close([zero, one])


def test_shards_of_a_dead_attempt_never_complete_a_later_attempts_step(tmp_path: Path) -> None:
    zero, one = ranks(tmp_path, asynchronous=False)
    for ckpt in (zero, one):
        ckpt.save(state(ckpt.rank, 5), 5)
    one.save(state(1, 10), 10)  # rank 0 died before it saved step 10
    close([zero, one])
    # the next attempt: every rank starts again from step 5; rank 1's step-10 shard is its own litter
    zero, one = ranks(tmp_path, asynchronous=False)
    assert not (tmp_path / "step-000000000010" / "rank-00001").exists()
    assert zero.load_latest()["step"] == 5 and one.load_latest()["step"] == 5
    zero.save(state(0, 10), 10)
    assert not (tmp_path / "step-000000000010" / "job.json").exists()  # waits for rank 1's new shard
    one.save(state(1, 10), 10)
    assert layouts.newest_complete(tmp_path).step == 10
    close([zero, one])


def test_a_damaged_shard_sends_every_rank_back_to_the_previous_step(tmp_path: Path) -> None:
    zero, one = ranks(tmp_path, asynchronous=False)
    for step in (5, 10):
        for ckpt in (zero, one):
            ckpt.save(state(ckpt.rank, step), step)
    close([zero, one])
    data = tmp_path / "step-000000000010" / "rank-00001" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))  # same size, wrong checksum: only a full read finds it
    zero, one = ranks(tmp_path, asynchronous=False)
    with pytest.raises(CheckpointError, match="rank 1's shard of step-000000000010 is damaged"):
        one.load_latest()
    # step 10 no longer counts for any rank: every rank's next attempt resumes from step 5
    assert layouts.newest_complete(tmp_path).step == 5
    assert zero.load_latest()["step"] == 5 and one.load_latest()["step"] == 5
    close([zero, one])


def test_old_steps_are_pruned_to_keep_and_unfinished_older_steps_go_too(tmp_path: Path) -> None:
    zero, one = ranks(tmp_path, keep=2, asynchronous=False)
    for step in (1, 2, 3):
        for ckpt in (zero, one):
            ckpt.save(state(ckpt.rank, step), step)
    zero.save(state(0, 4), 4)  # rank 1 died while saving step 4
    close([zero, one])
    zero, one = ranks(tmp_path, keep=2, asynchronous=False)
    for step in (5, 6):
        for ckpt in (zero, one):
            ckpt.save(state(ckpt.rank, step), step)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-"))
    assert names == ["step-000000000005", "step-000000000006"]
    close([zero, one])


def test_a_different_number_of_ranks_is_a_clear_error(tmp_path: Path) -> None:
    pair = ranks(tmp_path, asynchronous=False)
    for ckpt in pair:
        ckpt.save(state(ckpt.rank, 3), 3)
    close(pair)
    trio = ranks(tmp_path, world_size=3, asynchronous=False)
    with pytest.raises(CheckpointError, match="saved by 2 ranks and this job has 3"):
        trio[2].load_latest()
    close(trio)


def test_the_rank_and_world_size_come_from_the_launchers_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ckpt = Checkpointer(tmp_path, handle_signals=False, asynchronous=False)
    assert (ckpt.rank, ckpt.world_size, ckpt.sharded) == (1, 2, True)
    ckpt.save({"step": 0}, 0)
    assert (tmp_path / "step-000000000000" / "rank-00001" / "manifest.json").exists()
    ckpt.close()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    single = Checkpointer(tmp_path / "single", handle_signals=False, asynchronous=False)
    single.save({"step": 0}, 0)
    assert (tmp_path / "single" / "step-000000000000" / "manifest.json").exists()  # one process: as before
    single.close()


class Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def tcp_store_pair():
    """A real torch TCPStore: its server, and a client of it (what each rank of a job holds)."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=5)
    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
    return server, dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=timeout)


def test_ranks_whose_clocks_started_apart_save_the_same_steps_through_the_jobs_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = tcp_store_pair()
    stores = iter([server, client])
    monkeypatch.setattr("trainguard.checkpoint.checkpointer.job_store", lambda: next(stores))
    clocks = [Clock(0.0), Clock(0.0)]
    zero, one = (Checkpointer(tmp_path, rank=r, world_size=2, every="10s", handle_signals=False, clock=clocks[r])
                 for r in range(2))  # fmt: skip
    clocks[1].now = -0.3  # rank 1 made its Checkpointer 0.3 s later: by its clock every save is due later
    saved: dict[int, list[int]] = {0: [], 1: []}
    for step in range(300):  # 100 ms a step, in lockstep
        for rank, ckpt in enumerate((zero, one)):
            clocks[rank].now += 0.1
            if ckpt.maybe_save(step, state(rank, step)):
                saved[rank].append(step)
            ckpt.wait()
    close([zero, one])
    assert saved[0] == saved[1] and len(saved[0]) >= 2, saved
    complete = {c.step for c in layouts.scan(tmp_path) if c.complete}
    assert set(saved[0][-3:]) <= complete, (saved, complete)  # keep=3: the newest three, whole


def test_a_store_that_stops_answering_never_stops_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server, client = tcp_store_pair()
    monkeypatch.setattr("trainguard.checkpoint.checkpointer.job_store", lambda: client)
    clock = Clock(0.0)
    ckpt = Checkpointer(tmp_path, rank=1, world_size=2, every="1s", handle_signals=False, clock=clock)
    assert not ckpt.maybe_save(0, state(1, 0))  # joined the job's store
    del server  # the store's server is gone (its node died)
    saved = []
    for step in range(1, 40):
        clock.now += 0.1
        if ckpt.maybe_save(step, state(1, step)):
            saved.append(step)
    ckpt.close()
    assert saved, "the rank saved nothing once the store was gone"
    assert "cannot reach torch.distributed's store" in caplog.text


def test_two_checkpointers_of_one_job_with_folders_of_one_name_keep_their_own_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, client = tcp_store_pair()
    stores = {0: server, 1: client}
    made: list[int] = []

    def store_of_the_rank_being_made():
        return stores[made[-1]]

    monkeypatch.setattr("trainguard.checkpoint.checkpointer.job_store", store_of_the_rank_being_made)
    clocks = [Clock(0.0), Clock(0.0)]
    often, rarely = [], []
    for rank in range(2):
        made.append(rank)
        often.append(Checkpointer(tmp_path / "a" / "ckpt", rank=rank, world_size=2, every="5s", handle_signals=False,
                                  clock=clocks[rank]))  # fmt: skip
        rarely.append(Checkpointer(tmp_path / "b" / "ckpt", rank=rank, world_size=2, every="1h", handle_signals=False,
                                   clock=clocks[rank]))  # fmt: skip
    for step in range(200):
        for rank in range(2):
            made.append(rank)  # the store this rank's Checkpointers join at their first maybe_save
            clocks[rank].now += 0.1
            often[rank].maybe_save(step, state(rank, step))
            rarely[rank].maybe_save(step, state(rank, step))
            often[rank].wait()
    close(often + rarely)
    assert [c.step for c in layouts.scan(tmp_path / "a" / "ckpt") if c.complete]
    assert not list((tmp_path / "b" / "ckpt").glob("step-*"))  # every="1h": nothing was due


def test_a_rank_whose_steps_never_complete_keeps_only_keep_of_its_shards(tmp_path: Path) -> None:
    """Only rank 0 makes a Checkpointer (`if rank == 0: ...`): its shards never complete a step, and
    must not pile up until the disk is full."""
    alone = Checkpointer(tmp_path, rank=0, world_size=2, every=None, every_steps=1, keep=2, handle_signals=False)
    for step in range(10):
        assert alone.maybe_save(step, state(0, step))
        alone.wait()
    alone.close()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000000008", "step-000000000009"]
