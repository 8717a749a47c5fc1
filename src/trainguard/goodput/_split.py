"""Goodput's computation: a run's attempts and checkpoints split into kept training, work lost and
overhead (the rules: ``trainguard.goodput``). Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.goodput._records import AttemptRecord, CheckpointMark, Goodput, Loss, attempt_records, checkpoint_marks


@dataclass
class _Segment:
    """A stretch of training still counted as kept: ``points`` are (time, step) from its start to
    its end, steps non-decreasing (None throughout where the job reports no steps)."""

    points: list[tuple[float, float | None]]

    @property
    def t0(self) -> float:
        return self.points[0][0]

    @property
    def t1(self) -> float:
        return self.points[-1][0]

    @property
    def has_steps(self) -> bool:
        return self.points[0][1] is not None

    def keep_until_step(self, step: float) -> float:
        """Keep the part up to ``step``; the steps dropped."""
        first, last = self.points[0][1], self.points[-1][1]
        if last <= step:
            return 0.0
        kept = [p for p in self.points if p[1] <= step]
        if kept and kept[-1][1] < step:
            later = next(p for p in self.points if p[1] > step)
            (ta, sa), (tb, sb) = kept[-1], later
            kept.append((ta + (tb - ta) * (step - sa) / (sb - sa), step))
        self.points = kept
        return last - max(first, step)

    def keep_until_time(self, when: float) -> None:
        kept = [p for p in self.points if p[0] <= when]
        if kept and kept[-1][0] < when:
            later = next(p for p in self.points if p[0] > when)
            (ta, sa), (tb, sb) = kept[-1], later
            step = None if sa is None or sb is None else sa + (sb - sa) * (when - ta) / (tb - ta)
            kept.append((when, step))
        self.points = kept


@dataclass(frozen=True)
class _ResumePoint:
    step: int | None
    time: float | None
    fresh: bool  # no checkpoint: everything before is redone


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _mark_for(path: str | None, before: float, checkpoints: Sequence[CheckpointMark]) -> CheckpointMark | None:
    """The newest record of the checkpoint at ``path`` written before ``before``."""
    if path is None:
        return None
    found = [c for c in checkpoints if c.path == path and c.time <= before]
    return max(found, key=lambda c: c.time) if found else None


def _resume_point(attempt: AttemptRecord, checkpoints: Sequence[CheckpointMark]) -> _ResumePoint:
    mark = _mark_for(attempt.resumed_from, attempt.started_at, checkpoints)
    reported = _number(attempt.progress.get("resumed_step"))
    step = int(reported) if reported is not None else (mark.step if mark else None)
    if step is None and attempt.resumed_from is None:
        return _ResumePoint(None, None, fresh=True)
    return _ResumePoint(step, mark.time if mark else None, fresh=False)


def _newest_before(end: float, checkpoints: Sequence[CheckpointMark]) -> _ResumePoint:
    before = [c for c in checkpoints if c.time <= end]
    if not before:
        return _ResumePoint(None, None, fresh=True)
    newest = max(before, key=lambda c: c.time)
    return _ResumePoint(newest.step, newest.time, fresh=False)


def _step_points(
    first: float, last: float, end: float, first_step: float, last_step: float, checkpoints: Sequence[CheckpointMark]
) -> list[tuple[float, float | None]]:
    """(time, step) through one attempt's training: its first and last reported steps, and between
    and after them the checkpoints saved meanwhile (the job reports its step only every few seconds;
    each save says exactly when a step was done). Steps never go back."""
    points: list[tuple[float, float | None]] = [(first, first_step)]
    saved = [(c.time, float(c.step)) for c in checkpoints if c.step is not None and first < c.time <= end]
    for when, step in sorted([*saved, (last, max(first_step, last_step))]):
        if when <= points[-1][0] or step < points[-1][1] or (when > last and step <= last_step):
            continue
        points.append((when, step))
    return points


@dataclass
class _Cut:
    """The training a resume from a checkpoint (or an end after it) takes out of what was kept."""

    seconds: float = 0.0
    steps: float = 0.0
    measured_by: str = "steps"

    def charge(self, loss: Loss) -> None:
        loss.recomputed_s += self.seconds
        if self.steps:
            loss.recomputed_steps = (loss.recomputed_steps or 0) + round(self.steps)
        if self.measured_by != "steps":
            loss.measured_by = self.measured_by


def _cut(segments: list[_Segment], point: _ResumePoint) -> _Cut:
    """Drop from ``segments`` the training a resume from ``point`` redoes."""
    cut = _Cut()
    by_checkpoints = unknown = False
    kept: list[_Segment] = []
    for seg in segments:
        duration = seg.t1 - seg.t0
        if point.fresh:
            if seg.has_steps:
                cut.steps += seg.points[-1][1] - seg.points[0][1]
            else:
                by_checkpoints = True
            seg.points = []
        elif point.step is not None and seg.has_steps:
            cut.steps += seg.keep_until_step(point.step)
        elif point.time is not None:
            by_checkpoints = True
            seg.keep_until_time(point.time)
        else:
            unknown = True  # resumed from a checkpoint of unknown step and time: nothing can be said
        left = seg.points[-1][0] - seg.points[0][0] if len(seg.points) > 1 else 0.0
        cut.seconds += duration - left
        if left > 0:
            kept.append(seg)
    segments[:] = kept
    cut.measured_by = "unknown" if unknown else "checkpoints" if by_checkpoints else "steps"
    return cut


def _reported_steps(attempt: AttemptRecord) -> tuple[float, float, float, float] | None:
    """(first step's time, last step's time, first step, last step) the attempt reported, if it did."""
    reported = attempt.progress
    values = [_number(reported.get(key)) for key in ("first_step_time", "step_time", "first_step", "step")]
    return None if None in values else tuple(values)  # type: ignore[return-value]


def _active_until(attempt: AttemptRecord, last_seen: float, end: float, *, otherwise: float) -> float:
    """Until when the attempt trained. A running attempt is training still. One killed, not stopped
    by itself: the job reports its step every few seconds and the supervisor saw it active (its
    output) until ``last_active_time``, so it trained until then (and at least until ``last_seen``,
    its newest step or checkpoint), not until its last report, and went silent only after (a hang).
    Otherwise (it ended by itself, or its supervisor recorded no activity): ``otherwise``."""
    if attempt.ended_at is None:
        return end
    seen = _number(attempt.progress.get("last_active_time"))
    if attempt.finished or attempt.progress.get("stop_signal") is not None or seen is None:
        return otherwise
    return _clamp(seen, last_seen, end)


def compute(
    attempts: Iterable[AttemptRecord], checkpoints: Sequence[CheckpointMark], *, now: float, run_active: bool
) -> Goodput:
    """The goodput of one run. ``now`` ends a running attempt; ``run_active`` says whether the run
    may still continue by itself (then the work since its newest checkpoint is unsaved, not lost yet)."""
    ordered = sorted(attempts, key=lambda a: a.n)
    # Without steps and without checkpoints nothing tells training from start-up, a hang or idling.
    known = bool(checkpoints) or any(_reported_steps(a) for a in ordered)
    segments: list[_Segment] = []
    losses: dict[int, Loss] = {}
    wall = training = overhead = paused = unknown = 0.0
    methods: set[str] = set()
    previous: AttemptRecord | None = None
    previous_end = 0.0
    for index, attempt in enumerate(ordered):
        start = attempt.started_at
        if attempt.ended_at is not None:
            end = attempt.ended_at
        elif index + 1 < len(ordered):  # an attempt whose end was never recorded: until the next began
            end = ordered[index + 1].started_at
        else:
            end = now
        end = max(end, start)
        after_death = previous is not None and previous.died
        if previous is not None:
            loss = losses.setdefault(previous.n, Loss(previous.n, previous.cause if previous.died else None))
            gap = max(0.0, start - previous_end)
            if after_death:
                loss.restart_s += gap
                wall += gap
            else:
                paused += gap
            _cut(segments, _resume_point(attempt, checkpoints)).charge(loss)
        wall += end - start
        steps = _reported_steps(attempt)
        if steps is not None:
            first_t, last_t, first_s, last_s = steps
            methods.add("steps")
            first = _clamp(first_t, start, end)
            last = _clamp(last_t, first, end)
            if after_death:
                losses[previous.n].restart_s += first - start
            else:
                overhead += first - start
            points = _step_points(first, last, end, first_s, last_s, checkpoints)
            (t_first, s_first), (t_last, s_last) = points[0], points[-1]
            rate = (t_last - t_first) / (s_last - s_first) if s_last > s_first and t_last > t_first else None
            active_end = _active_until(attempt, t_last, end, otherwise=t_last)
            if active_end > t_last:
                points.append((active_end, s_last + (active_end - t_last) / rate if rate else s_last))
            if active_end > first:
                segments.append(_Segment(points))
            training += active_end - first
        elif known:
            methods.add("checkpoints")
            saved = [c.time for c in checkpoints if start < c.time <= end]
            active_end = _active_until(attempt, max(saved, default=start), end, otherwise=end)
            segments.append(_Segment([(start, None), (active_end, None)]))
            training += active_end - start
        else:
            unknown += end - start
            active_end = end
        tail = end - active_end
        if attempt.died:
            losses.setdefault(attempt.n, Loss(attempt.n, attempt.cause)).stalled_s += tail
        else:
            overhead += tail
        previous, previous_end = attempt, end
    unsaved = _Cut()
    if previous is not None and not previous.finished:
        # Of the last attempt's work, only what its newest checkpoint holds is kept (so far).
        unsaved = _cut(segments, _newest_before(previous_end, checkpoints))
        if not run_active:
            loss = losses.setdefault(previous.n, Loss(previous.n, previous.cause))
            loss.redone = False
            unsaved.charge(loss)
            unsaved = _Cut()
    kept = sum((seg.t1 - seg.t0 for seg in segments), 0.0)
    if ordered and not known:
        methods = {"unknown"}
        for loss in losses.values():
            loss.measured_by = "unknown"
    measured_by = "mixed" if len(methods) > 1 else (methods.pop() if methods else "steps")
    ordered_losses = tuple(loss for _, loss in sorted(losses.items()) if loss.cause is not None or loss.total_s > 0)
    return Goodput(wall, training, kept, overhead, paused, ordered_losses, measured_by, unsaved_s=unsaved.seconds,
                   unsaved_steps=round(unsaved.steps) if unsaved.steps else None, unknown_s=unknown,
                   active=run_active)  # fmt: skip


def of_run(run: Any, events: Iterable[Mapping[str, Any]], *, now: float) -> Goodput:
    """The goodput of a registry ``Run`` from its recorded events."""
    records = attempt_records(run.attempts, run_state=run.state)
    return compute(records, checkpoint_marks(events), now=now, run_active=run.active)
