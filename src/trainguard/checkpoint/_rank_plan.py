"""The ranks of a job: which rank of how many this process is, and the rank plan of a job of several
ranks: a save that one rank's stop signal or clock asks for is taken at one step by every rank,
planned through torch.distributed's store (``agreement``), so that the step is complete. Without a
store, or once it stops answering, each rank decides alone."""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable
from typing import Any

from trainguard.checkpoint.agreement import SavePlans, job_namespace

log = logging.getLogger("trainguard.checkpoint")

# How many Checkpointers of each folder name (and rank) this process has joined to its job's store,
# in order: every rank makes them in the same order, so the n-th one of a name is the same on every rank.
_ORDINALS: collections.Counter[tuple[str, int]] = collections.Counter()


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def rank_and_world_size(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's rank and its job's world size: as given, else as the launcher set them."""
    return (rank if rank is not None else _env_int("RANK", 0),
            world_size if world_size is not None else _env_int("WORLD_SIZE", 1))  # fmt: skip


class RankPlan:
    """One Checkpointer's plans with the other ranks, joined at its first decision through the store
    that ``find_store`` gives then (torch.distributed's: ``agreement.job_store``; None without one)."""

    def __init__(
        self, directory_name: str, rank: int, world_size: int, clock: Callable[[], float], find_store: Callable[[], Any]
    ) -> None:
        self.directory_name = directory_name
        self.rank = rank
        self.world_size = world_size
        self._clock = clock
        self._find_store = find_store
        self._plans: SavePlans | None = None
        self._store_lost = False
        self._warned_alone = self._warned_late = self._members_checked = False

    def decide(
        self, step: int, signum: int | None, time_due: bool, *, stop_requested: bool
    ) -> tuple[int | None, bool, bool]:
        """(stop signal, save due by time, planned with the other ranks) at ``step``, from this
        rank's own stop signal and clock: the step the ranks planned together, or without the job's
        store this rank's own."""
        plans = self._save_plans()
        if plans is None:
            if time_due and not self._warned_alone:
                self._warned_alone = True
                log.warning("rank %d of %d decides its saves by time alone (torch.distributed is not running): "
                            "other ranks may save other steps; every_steps saves the same steps on every rank",
                            self.rank, self.world_size)  # fmt: skip
            return signum, time_due, False
        stop = signum if signum is not None and not stop_requested else None
        try:
            plan = plans.due(step, wanted=stop is not None or time_due, stop=stop or 0)
            if plan is not None:
                self._check_members(plans)
        except Exception as exc:  # whatever the store raises, training must not die of it
            self._lose_the_store(exc)
            return signum, time_due, False
        if plan is None:
            return None, False, False
        if plans.late and not self._warned_late:
            self._warned_late = True
            log.warning("rank %d read the plan to save step %d late (at step %d): the ranks are not in step, "
                        "that step may not be complete", self.rank, plan.step, step)  # fmt: skip
        return (plan.stop or None), not plan.stop, True

    def _save_plans(self) -> SavePlans | None:
        if self._plans is None and not self._store_lost:
            store = self._find_store()
            if store is None:
                return None
            ordinal = _ORDINALS[(self.directory_name, self.rank)]
            _ORDINALS[(self.directory_name, self.rank)] += 1
            namespace = job_namespace(self.directory_name, self.world_size, ordinal)
            plans = SavePlans(store, namespace, self.world_size, self._clock, rank=self.rank)
            try:
                plans.join()
            except Exception as exc:  # the same
                self._lose_the_store(exc)
                return None
            self._plans = plans
        return self._plans

    def _lose_the_store(self, exc: Exception) -> None:
        """The job's store stopped answering (its server's node died, the job is being torn down): each
        rank decides alone from now on; the failure that matters is the one that took the store."""
        self._store_lost, self._plans = True, None
        log.warning("rank %d cannot reach torch.distributed's store (%s): it decides its saves alone from now on",
                    self.rank, exc)  # fmt: skip

    def _check_members(self, plans: SavePlans) -> None:
        """A job of several ranks where some ranks make no Checkpointer (``if rank == 0: ...``) never
        completes a step: said once, at the first plan, with the fix."""
        if self._members_checked:
            return
        self._members_checked = True
        members = plans.members()
        if members < self.world_size:
            log.warning("only %d of the job's %d ranks made a Checkpointer: a step is complete only once every rank "
                        "saved its shard; make one on every rank, or pass world_size=1 on the one rank that saves "
                        "for the job", members, self.world_size)  # fmt: skip
