"""What to look at next when a diagnosis does not decide (data/next_steps.toml): the table of steps,
each with the conditions under which it applies, and the pure function that picks them from the
diagnosis and from what it had to go on (an exit status, a kernel log, one log or several)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from trainguard._i18n import Text
from trainguard._resources import load_toml
from trainguard.causes import CAUSE_IDS, UNKNOWN
from trainguard.diagnosis.classify import Diagnosis
from trainguard.errors import DataError

_FLAGS = ("exit_status", "kernel_log", "oom_counters", "one_log", "several_ranks", "silent")
_CAUSES = "causes"


@dataclass(frozen=True)
class Gathered:
    """What a diagnosis had to go on, besides the lines of its logs."""

    exit_status: bool = False  # an exit status was given or recorded
    kernel_log: bool = False  # a kernel log of the time of death was read, whatever it held
    oom_counters: bool = False  # the OOM kill counters of the machine or the job's cgroup were read
    logs: int = 1  # how many logs were judged together (a rank's or a node's each, error files)
    ranks: frozenset[int] = frozenset()  # the ranks the lines read name
    silent: bool = False  # no line of the logs reports a failure


@dataclass(frozen=True)
class Step:
    id: str
    when: tuple[Mapping[str, Any], ...]  # it applies when one of these holds (each key of it)
    text: Text
    source: str


@dataclass(frozen=True)
class StepTable:
    below_confidence: float
    max_shown: int
    steps: tuple[Step, ...]


def next_steps(diagnosis: Diagnosis, gathered: Gathered, table: StepTable) -> tuple[Step, ...]:
    """The steps that would decide an undecided diagnosis (``unknown``, or below the table's
    confidence), in the table's order, leaving out what was already gathered. Pure."""
    if diagnosis.cause != UNKNOWN and diagnosis.confidence >= table.below_confidence:
        return ()
    facts: dict[str, Any] = {
        "exit_status": gathered.exit_status,
        "kernel_log": gathered.kernel_log,
        "oom_counters": gathered.oom_counters,
        "one_log": gathered.logs <= 1,
        "several_ranks": len(gathered.ranks) >= 2,
        "silent": gathered.silent,
    }
    readings = {diagnosis.cause} | {cause for cause, _confidence in diagnosis.alternatives}
    chosen = [step for step in table.steps if any(_holds(c, facts, readings) for c in step.when)]
    return tuple(chosen[: table.max_shown])


def _holds(condition: Mapping[str, Any], facts: Mapping[str, Any], readings: set[str]) -> bool:
    for key, wanted in condition.items():
        if key == _CAUSES:
            if not readings & set(wanted):
                return False
        elif facts[key] != wanted:
            return False
    return True


def parse_steps(raw: Mapping[str, Any]) -> StepTable:
    try:
        below, shown = float(raw["below_confidence"]), int(raw["max_shown"])
        rows = raw["step"]
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"next_steps.toml: needs below_confidence, max_shown and [[step]] rows: {exc}") from exc
    steps = tuple(_parse_step(row) for row in rows)
    ids = [step.id for step in steps]
    if len(set(ids)) != len(ids):
        raise DataError(f"next_steps.toml: step ids repeat: {ids}")
    return StepTable(below, shown, steps)


def _parse_step(row: Mapping[str, Any]) -> Step:
    step_id = row.get("id", "?")
    try:
        when = tuple(dict(condition) for condition in row["when"])
        step = Step(step_id, when, Text(row["en"], row["zh"]), row["source"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"next_steps.toml: step {step_id!r} needs id, when, source, en and zh: {exc}") from exc
    if not when or not all(when):
        raise DataError(f"next_steps.toml: step {step_id!r}: every condition needs a key")
    for condition in when:
        for key, wanted in condition.items():
            if key == _CAUSES:
                unknown = set(wanted) - set(CAUSE_IDS) if isinstance(wanted, list) else {wanted}
                if unknown:
                    raise DataError(f"next_steps.toml: step {step_id!r} names no cause {sorted(unknown)}")
            elif key not in _FLAGS or not isinstance(wanted, bool):
                raise DataError(f"next_steps.toml: step {step_id!r}: {key} = {wanted!r} is no condition")
    return step


@cache
def default_steps() -> StepTable:
    return parse_steps(load_toml("next_steps.toml"))
