"""What the ranks of a job ask for at a step end, agreed: a stop (a stop signal, or a save request
that says "then": "stop"), or a save that the supervisor asked for before training goes on. Taken
at the same step on every rank, or the collective save that follows would hang."""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.checkpoint.agreement import max_across_ranks as _max_of_each
from trainguard.checkpoint.saverequest import STOP_SIGNAL, SaveRequests
from trainguard.checkpoint.stopsignal import StopSignal


def max_of_each_across_ranks(values: Sequence[int]) -> list[int]:
    """The element-wise largest of ``values`` over every rank: one tiny all-reduce when
    torch.distributed is running with more than one rank; otherwise ``values`` themselves, and torch
    is not imported by this."""
    agreed = _max_of_each(values)
    return list(values) if agreed is None else agreed


def own_asks(stop: StopSignal, requests: SaveRequests) -> tuple[int, bool]:
    """What this rank asks for now: the stop signal's number (0 for none), and a save that goes on."""
    request = requests.check()
    signum = stop.received or (STOP_SIGNAL if request is not None and request.stop else 0)
    return signum, request is not None and not request.stop


def agreed_asks(stop: StopSignal, requests: SaveRequests) -> tuple[int, bool]:
    """``own_asks`` of every rank together: a stop if any rank stops, else a save if any rank asks."""
    signum, save = max_of_each_across_ranks(list(map(int, own_asks(stop, requests))))
    return signum, bool(save)
