"""How right the diagnosis is on a labelled set of crash logs, as plain figures: per cause precision and
recall, calibration by confidence band, coverage and precision of the confident answers, and the
costly mistakes, the ones that make the supervisor restart when it should not or stop when it should
not. Pure: judged rows and what the restart policy does after a death in, figures out
(tools/gen_accuracy.py renders them into docs/accuracy.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from trainguard.causes import Cause
from trainguard.supervisor.policy import Outcome, RestartPolicy, decide

CONFIDENT = 0.8  # issue 22: "coverage" and "precision" are those of the answers at this confidence or more
# Lower edges of the calibration bands; the last band runs to 1 included.
BAND_EDGES = (0.0, 0.25, 0.5, 0.8, 0.9)
# Issue 22's targets on the held-out part: (figure, goal, whether the figure must reach the goal or
# stay under it).
TARGETS = (
    ("confident_precision", 0.98, True),
    ("coverage", 0.70, True),
    ("accuracy", 0.85, True),
    ("costly_share", 0.02, False),
)


def share(part: int, whole: int) -> float | None:
    """part / whole; None when whole is 0 (nothing to measure)."""
    return part / whole if whole else None


class Action(str, Enum):
    """What the supervisor does after a first death it names so."""

    RESTART = "restart"  # and again after each death like it, to its budget: a loop on a bug
    ONCE = "once"  # one restart; the same cause again ends the run
    END = "end"  # the run ends: it needs a fix first


@dataclass(frozen=True)
class Judged:
    """One labelled log and what the diagnosis called it."""

    id: str
    label: str  # the root cause its thread established
    cause: str  # the cause the diagnosis named
    confidence: float

    @property
    def right(self) -> bool:
        return self.cause == self.label


@dataclass(frozen=True)
class CauseFigures:
    cause: str
    logs: int  # labelled this cause
    called: int  # diagnosed as this cause
    right: int

    @property
    def precision(self) -> float | None:
        return share(self.right, self.called)

    @property
    def recall(self) -> float | None:
        return share(self.right, self.logs)


@dataclass(frozen=True)
class Band:
    low: float
    high: float  # excluded, except for the last band (1.0)
    logs: int
    right: int


@dataclass(frozen=True)
class Figures:
    logs: int
    right: int
    confident: int  # answered at confidence >= CONFIDENT
    confident_right: int
    causes: tuple[CauseFigures, ...]  # in the catalogue's order; only causes labelled or called
    bands: tuple[Band, ...]
    stopped_wrongly: tuple[Judged, ...]  # the root cause is retried, the one named is not: the run ends
    restarted_wrongly: tuple[Judged, ...]  # the root cause is not retried, the one named is, again and again
    restarted_once: tuple[Judged, ...]  # the root cause is not retried, the one named gets one restart

    @property
    def costly(self) -> int:
        return len(self.stopped_wrongly) + len(self.restarted_wrongly)

    def fraction(self, figure: str) -> tuple[int, int]:
        """A figure as (part, whole): "accuracy" (right of all), "coverage" (confident of all),
        "confident_precision" (right of the confident) or "costly_share" (costly of all)."""
        return {
            "accuracy": (self.right, self.logs),
            "coverage": (self.confident, self.logs),
            "confident_precision": (self.confident_right, self.confident),
            "costly_share": (self.costly, self.logs),
        }[figure]


@dataclass(frozen=True)
class Target:
    figure: str  # a name Figures.fraction knows
    goal: float
    at_least: bool
    part: int
    whole: int

    @property
    def measured(self) -> float | None:
        return share(self.part, self.whole)

    @property
    def met(self) -> bool:
        if self.measured is None:
            return False
        return self.measured >= self.goal if self.at_least else self.measured <= self.goal


def against_targets(figures: Figures) -> tuple[Target, ...]:
    return tuple(Target(name, goal, at_least, *figures.fraction(name)) for name, goal, at_least in TARGETS)


def policy_action(causes: Mapping[str, Cause]) -> Callable[[str, float], Action]:
    """What the supervisor's own policy (`decide`, default settings) does after a first death named
    ``cause`` at ``confidence``, and whether a second death like it is restarted again."""

    def action(cause: str, confidence: float) -> Action:
        death = Outcome(exit_code=1, signal=None, cause=cause, new_lines=100, confidence=confidence)
        if not decide([death], RestartPolicy(), causes).restart:
            return Action.END
        return Action.RESTART if decide([death, death], RestartPolicy(), causes).restart else Action.ONCE

    return action


def judge(rows: Sequence[Judged], action: Callable[[str, float], Action], cause_order: Sequence[str]) -> Figures:
    """``action``: what the restart policy does after a death named a cause at a confidence
    (``policy_action``; a root cause is judged at confidence 1); ``cause_order``: the order of the
    per-cause rows (the catalogue's ids; a cause outside it comes after, by name)."""
    seen = {row.label for row in rows} | {row.cause for row in rows}
    order = [c for c in cause_order if c in seen] + sorted(seen - set(cause_order))
    causes = tuple(
        CauseFigures(
            cause,
            logs=sum(row.label == cause for row in rows),
            called=sum(row.cause == cause for row in rows),
            right=sum(row.right and row.label == cause for row in rows),
        )
        for cause in order
    )
    confident = [row for row in rows if row.confidence >= CONFIDENT]
    pairs = [(row, action(row.label, 1.0), action(row.cause, row.confidence)) for row in rows]
    return Figures(
        logs=len(rows),
        right=sum(row.right for row in rows),
        confident=len(confident),
        confident_right=sum(row.right for row in confident),
        causes=causes,
        bands=_bands(rows),
        stopped_wrongly=tuple(r for r, due, done in pairs if due is not Action.END and done is Action.END),
        restarted_wrongly=tuple(r for r, due, done in pairs if due is Action.END and done is Action.RESTART),
        restarted_once=tuple(r for r, due, done in pairs if due is Action.END and done is Action.ONCE),
    )


def _bands(rows: Sequence[Judged]) -> tuple[Band, ...]:
    bands = []
    for index, low in enumerate(BAND_EDGES):
        last = index == len(BAND_EDGES) - 1
        high = 1.0 if last else BAND_EDGES[index + 1]
        inside = [row for row in rows if low <= row.confidence and (row.confidence < high or last)]
        bands.append(Band(low, high, len(inside), sum(row.right for row in inside)))
    return tuple(bands)
