"""Agreeing across the ranks of a distributed job. What one rank's clock or signal decides (a save
that is due by time, a stop) must happen at the same step on every rank: a step is complete only
once every rank's shard is in place, and the collective save a framework makes after a stop hangs
when a rank is missing. Ranks whose clocks started a second apart never save the same step by time
on their own.

The Checkpointer agrees through torch.distributed's key-value store, never through a collective: a
collective of ours would pair with the training's own all-reduces wherever the ranks call
``maybe_save`` unequally (``if rank == 0: ckpt.maybe_save(...)``), and corrupt or hang them."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Every rank reads the store about this often (one round trip to the store's server), and a plan is
# made for a step at least twice as far ahead: every rank reads it before it gets there.
POLL_S = 0.5
MAX_LEAD_STEPS = 100_000
WARMUP_CALLS = 3


def _distributed_job() -> Any | None:
    """torch.distributed, when it runs with more than one rank (torch is not imported by this)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return None
    return dist


def max_across_ranks(values: Sequence[int]) -> list[int] | None:
    """The element-wise largest of ``values`` over every rank: one all-reduce when torch.distributed
    runs with more than one rank; None when it does not (torch is not imported by this). For hooks
    that every rank runs at the same point (framework callbacks), never for ``maybe_save``."""
    dist = _distributed_job()
    if dist is None:
        return None
    torch = sys.modules["torch"]
    on_gpu = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    tensor = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


class Store(Protocol):
    """What SavePlans needs of torch.distributed's store (TCPStore, FileStore, PrefixStore)."""

    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...


@dataclass(frozen=True)
class Plan:
    step: int  # every rank acts at its first call at or after this step
    stop: int  # the signal that asked for a stop, 0 for a save due by time

    def encode(self) -> str:
        return f"{self.step} {self.stop}"

    @classmethod
    def decode(cls, raw: bytes) -> Plan:
        step, stop = raw.decode().split()
        return cls(int(step), int(stop))


class SavePlans:
    """The job's saves due by time and its stops, numbered 0, 1, 2, ...: a rank that wants one
    writes plan N into the store (the first writer wins, the others take its plan), naming a step far
    enough ahead that every rank reads the plan before it gets there; every rank acts at that step."""

    def __init__(
        self,
        store: Store,
        namespace: str,
        world_size: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        rank: int = 0,
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._world_size = world_size
        self._rank = rank
        self._launch = 0  # which launch of the job on this store (a file store outlives its job)
        self._clock = clock
        self._number = 0  # the next plan's number
        self._plan: Plan | None = None  # plan number ``_number``, once read or made
        self._polled_at = -math.inf
        self._last: tuple[int, float] | None = None  # (step, time) of the previous call
        self._step_s = 0.0  # how long a step takes here (the fastest recent one)
        self._calls = 0
        self.late = 0  # plans this rank read after their step had passed (the ranks were not in step)

    def join(self) -> int:
        """Counts this rank among the job's Checkpointers; how many of this launch have joined so far.
        A store that outlived an earlier launch (``init_method=file://`` reused) still holds that
        launch's keys: each rank counts its own launches on the store, so the n-th launch of every
        rank is the same one, its plans its own, and an old stop is never replayed, even when only
        some ranks made a Checkpointer in an earlier launch."""
        self._launch = self._store.add(f"{self._namespace}/rank-{self._rank}/launches", 1) - 1
        return self._store.add(f"{self._namespace}/{self._launch}/members", 1)

    def members(self) -> int:
        return self._store.add(f"{self._namespace}/{self._launch}/members", 0)

    def due(self, step: int, *, wanted: bool, stop: int = 0) -> Plan | None:
        """Called by every rank at every step: the plan to act on at this step, or None. ``wanted``:
        this rank wants a save now (its period has passed, or ``stop`` names the signal it received)."""
        now = self._clock()
        self._measure(step, now)
        self._calls += 1
        # The first calls read the store every time: no step time is known to plan far enough ahead.
        if self._plan is None and (wanted or self._calls <= WARMUP_CALLS or now - self._polled_at >= POLL_S):
            self._polled_at = now
            key = self._key()
            if self._store.check([key]):
                self._plan = Plan.decode(self._store.get(key))
            elif wanted:
                proposal = Plan(step + self._lead_steps(), stop)
                self._plan = Plan.decode(self._store.compare_set(key, "", proposal.encode()))
        if self._plan is None or step < self._plan.step:
            return None
        plan, self._plan = self._plan, None
        self._number += 1
        if step > plan.step:
            self.late += 1
        return plan

    def _key(self) -> str:
        return f"{self._namespace}/{self._launch}/plan/{self._number}"

    def _measure(self, step: int, now: float) -> None:
        if self._last is not None and step > self._last[0]:
            per_step = (now - self._last[1]) / (step - self._last[0])
            # The fastest recent step, drifting up slowly: a pause (evaluation, a slow batch) must not
            # make the plan's lead shorter than the time every rank needs to read it.
            self._step_s = per_step if self._step_s == 0 else min(per_step, self._step_s * 1.05)
        self._last = (step, now)

    def _lead_steps(self) -> int:
        """Steps to the planned one: every other rank reads the store before then (at each of its
        first calls, then at least once per POLL_S, and at most a step behind or ahead)."""
        if self._step_s <= 0:
            return WARMUP_CALLS
        if self._step_s >= POLL_S:
            # Every rank reads the store at every call, and no rank passes the next step's
            # collective before this one's call returned: the next step is enough (a stop on 10 s
            # steps must fit a 30 s grace period).
            return 1
        return min(MAX_LEAD_STEPS, math.ceil(2 * POLL_S / self._step_s) + 2)


def job_store() -> Any | None:
    """torch.distributed's key-value store of this job, when it runs with more than one rank."""
    dist = _distributed_job()
    if dist is None:
        return None
    with contextlib.suppress(Exception):  # a private helper of torch's: absent, it means no agreement
        return dist.distributed_c10d._get_default_store()
    return None


def job_namespace(name: str, world_size: int, ordinal: int = 0, environ: Mapping[str, str] = os.environ) -> str:
    """Keys of one Checkpointer of the job in its store: the same on every rank of every node.
    ``ordinal``: the how-manieth Checkpointer on a folder of that name this process made (two in
    one job, ``a/ckpt`` and ``b/ckpt``, must not share plans; the full path may differ between
    nodes that mount the shared folder in different places).

    Only what every node of one launch shares goes in: the job's id (torchrun's rendezvous id,
    Slurm's job id). Never a node's own count of its attempts or restarts: trainguard restarts one
    node after a peer_failure while another starts fresh (TRAINGUARD_ATTEMPT 2 and 1), and
    torchrun's agents count their restarts apart (TORCHELASTIC_RESTART_COUNT), yet their ranks meet
    in one store. A new launch gets a new store, or (a store that outlives its launch, or the
    agent's store, keyed by restart already) its own keys through ``SavePlans.join``."""
    run = environ.get("TORCHELASTIC_RUN_ID") or environ.get("SLURM_JOB_ID") or "job"
    return f"trainguard/{run}/{world_size}/{name}#{ordinal}"
