"""Agreeing across the ranks of a distributed job. What one rank's clock or signal decides (a save
that is due by time, a stop) must happen at the same step on every rank: a step is complete only
once every rank's shard is in place, and the collective save a framework makes after a stop hangs
when a rank is missing. Ranks whose clocks started a second apart never save the same step by time
on their own."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

# Ranks compare notes about this often: one tiny all-reduce per period, however short the steps.
AGREE_EVERY_S = 1.0
MAX_CALLS_BETWEEN = 10_000


def max_across_ranks(values: Sequence[int]) -> list[int] | None:
    """The element-wise largest of ``values`` over every rank: one all-reduce when torch.distributed
    runs with more than one rank; None when it does not (torch is not imported by this)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return None
    on_gpu = "nccl" in str(dist.get_backend()) and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    tensor = torch.tensor(list(values), dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


class RankAgreement:
    """Decides, with the other ranks, at calls they choose together: every rank calls ``decide`` once
    per training step; the ranks all-reduce at the same calls (the first, then after as many calls
    as the slowest rank makes in about AGREE_EVERY_S) and get the same answer there; in between
    nothing is decided (a signal or a due save waits for the next agreement, about a second)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, reduce=max_across_ranks) -> None:
        self._clock = clock
        self._reduce = reduce
        self._calls_left = 0  # calls until the next agreement; 0: this one
        self._between = 1  # calls from the last agreement to the next
        self._last_agreed_at: float | None = None

    def decide(self, signum: int, due: bool, busy: bool) -> tuple[int, bool, bool] | None:
        """(signal, due, busy) as the job sees them: the largest signal any rank received, whether
        any rank's period has passed, whether any rank is still writing its last save. None when
        there is nothing to agree with (no torch.distributed, one rank): each rank decides alone."""
        if self._calls_left > 0:
            self._calls_left -= 1
            return 0, False, False
        now = self._clock()
        proposal = 1
        if self._last_agreed_at is not None:
            per_call = max((now - self._last_agreed_at) / self._between, 1e-6)
            proposal = max(1, min(MAX_CALLS_BETWEEN, int(AGREE_EVERY_S / per_call)))
        agreed = self._reduce([signum, int(due), int(busy), -proposal])
        if agreed is None:
            return None
        self._between = -agreed[3]  # the fewest calls any rank proposed: the same on every rank
        self._calls_left = self._between - 1
        self._last_agreed_at = now
        return agreed[0], bool(agreed[1]), bool(agreed[2])
