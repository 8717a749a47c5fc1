"""Goodput's input (a run's attempts and checkpoints, as the registry's records become them) and its
output (the split of the run's wall time, what each attempt's end cost). Pure data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AttemptRecord:
    n: int
    started_at: float
    ended_at: float | None  # None: still running
    died: bool  # ended with a cause of death (not a success, not a stop that was asked for)
    cause: str | None = None
    resumed_from: str | None = None  # the checkpoint path it was given, None: started fresh
    progress: Mapping[str, Any] = field(default_factory=dict)  # what the job reported (trainguard.progress)
    stopped: bool = False  # ended without a death before its training was done: a stop, a signal it obeyed

    @property
    def finished(self) -> bool:
        """It ended the training: its unsaved work is the run's result, not lost."""
        return self.ended_at is not None and not self.died and not self.stopped


@dataclass(frozen=True)
class CheckpointMark:
    time: float  # when it was written
    step: int | None
    path: str | None = None


@dataclass
class Loss:
    """What the end of one attempt cost."""

    attempt: int
    cause: str | None  # None: a stop (its unsaved steps can still be redone)
    recomputed_s: float = 0.0
    recomputed_steps: int | None = None
    restart_s: float = 0.0
    stalled_s: float = 0.0
    measured_by: str = "steps"  # "steps" | "checkpoints" | "unknown"
    redone: bool = True  # False: the run ended with this attempt, its work since the newest checkpoint never saved

    @property
    def total_s(self) -> float:
        return self.recomputed_s + self.restart_s + self.stalled_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "cause": self.cause,
            "recomputed_s": round(self.recomputed_s, 3),
            "recomputed_steps": self.recomputed_steps,
            "redone": self.redone,
            "restart_s": round(self.restart_s, 3),
            "stalled_s": round(self.stalled_s, 3),
            "measured_by": self.measured_by,
        }


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    training_s: float
    kept_s: float
    overhead_s: float  # start-up and shut-down not caused by a death
    paused_s: float  # between a stop and the run's continuation: not in wall_s
    losses: tuple[Loss, ...]
    measured_by: str  # "steps", "checkpoints", "mixed" or "unknown" (no steps, no checkpoints)
    unsaved_s: float = 0.0  # a run still going: trained since its newest checkpoint, neither kept nor lost yet
    unsaved_steps: int | None = None
    unknown_s: float = 0.0  # attempts of a job that reports neither steps nor checkpoints
    active: bool = False  # the run may still continue by itself: its figures are so far

    @property
    def ratio(self) -> float | None:
        return self.kept_s / self.wall_s if self.wall_s > 0 and self.measured_by != "unknown" else None

    @property
    def recomputed_s(self) -> float:
        return sum(loss.recomputed_s for loss in self.losses)

    @property
    def never_saved_s(self) -> float:
        """Of ``recomputed_s``, the work the run's unfinished end left unsaved: no attempt redid it (yet)."""
        return sum(loss.recomputed_s for loss in self.losses if not loss.redone)

    @property
    def restart_s(self) -> float:
        return sum(loss.restart_s for loss in self.losses)

    @property
    def stalled_s(self) -> float:
        return sum(loss.stalled_s for loss in self.losses)

    def lost_by_kind(self) -> dict[str, float]:
        return {"recomputed": self.recomputed_s, "restart": self.restart_s, "stalled": self.stalled_s}

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "goodput": None if ratio is None else round(ratio, 4),
            "wall_s": round(self.wall_s, 3),
            "training_s": round(self.training_s, 3),
            "kept_s": round(self.kept_s, 3),
            "lost_s": {kind: round(seconds, 3) for kind, seconds in self.lost_by_kind().items()},
            "unsaved_s": round(self.unsaved_s, 3),
            "unsaved_steps": self.unsaved_steps,
            "unknown_s": round(self.unknown_s, 3),
            "overhead_s": round(self.overhead_s, 3),
            "paused_s": round(self.paused_s, 3),
            "measured_by": self.measured_by,
            "active": self.active,
            "losses": [loss.to_dict() for loss in self.losses],
        }


def _ended_unfinished(attempt: Any) -> bool:
    """A registry attempt that ended without a death and without finishing: a stop (asked for, or a
    signal the job obeyed and reported). Only an exit 0 with no stop reported finished the training."""
    return (attempt.ended_at is not None and attempt.cause is None
            and (attempt.exit_code != 0 or bool((attempt.progress or {}).get("stop_signal"))))  # fmt: skip


def attempt_records(attempts: Iterable[Any], *, run_state: str | None = None) -> list[AttemptRecord]:
    """The registry's attempts (``trainguard.store.registry.Attempt``) as goodput's input. The run's
    state, where given, settles how its last attempt ended: stopped did not finish, succeeded did."""
    attempts = list(attempts)
    records = []
    for a in attempts:
        stopped = _ended_unfinished(a)
        if a is attempts[-1] and a.ended_at is not None and a.cause is None and run_state in ("stopped", "succeeded"):
            stopped = run_state == "stopped"
        records.append(AttemptRecord(n=a.n, started_at=a.started_at, ended_at=a.ended_at, died=a.cause is not None,
                                     cause=a.cause, resumed_from=a.resumed_from, progress=a.progress or {},
                                     stopped=stopped))  # fmt: skip
    return records


def checkpoint_marks(events: Iterable[Mapping[str, Any]]) -> list[CheckpointMark]:
    """The checkpoints the supervisor recorded (events of kind ``checkpoint``)."""
    marks = []
    for event in events:
        if event.get("kind") != "checkpoint":
            continue
        step = event.get("step")
        marks.append(CheckpointMark(float(event["time"]), step if isinstance(step, int) else None, event.get("path")))
    return marks
