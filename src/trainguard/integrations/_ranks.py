"""Agreeing across the ranks of a distributed job: a stop is taken at the same step on every rank,
or the collective save that follows would hang."""

from __future__ import annotations

from trainguard.checkpoint.agreement import max_across_ranks as _max_of_each


def max_across_ranks(value: int) -> int:
    """The largest ``value`` any rank passes (a signal number, 0 for none). One tiny all-reduce when
    torch.distributed is running with more than one rank; otherwise ``value`` itself, and torch is
    not imported by this."""
    agreed = _max_of_each([value])
    return value if agreed is None else agreed[0]
