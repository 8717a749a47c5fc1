"""How often jobs die on this machine: the mean time between failures that ``every="auto"`` plans
its checkpoint interval for, from the attempts of this machine's runs in the registry
(``checkpoint.interval.estimate_mtbf``: the stated default before there is any history)."""

from __future__ import annotations

from trainguard.checkpoint.interval import AttemptRecord, MtbfEstimate, estimate_mtbf
from trainguard.errors import TrainguardError
from trainguard.store.registry import Registry


def machine_mtbf(registry: Registry, host: str, now: float) -> MtbfEstimate:
    """The estimate over every attempt of this machine's runs, the running ones up to ``now``. A
    registry that cannot be read gives the default."""
    try:
        runs = [run for run in registry.all() if run.host == host]
    except TrainguardError:
        runs = []
    attempts = [AttemptRecord(a.started_at, a.ended_at, a.cause) for run in runs for a in run.attempts]
    return estimate_mtbf(attempts, now=now)
