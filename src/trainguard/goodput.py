"""Goodput: of a run's wall time, how much trained and was kept, and what each death cost. PURE: a
function of the run's attempts (their times and what the job reported through
``trainguard.progress``) and of its checkpoints' times and steps; no I/O, no clock.

The wall time is every attempt's span plus the gaps after deaths (backoff, start-up); the gap after a
stop that a person asked for, before the run was continued, is a pause, not part of it. It splits
exactly into:

- training: from an attempt's first reported step to its last (the whole attempt when the job
  reports no steps). Of that, *kept* is what no later attempt had to redo; the rest is
- recomputed: steps redone after resuming from an older checkpoint: the steps past the checkpoint
  the next attempt resumed from, at the rate the dying attempt trained; where steps are unknown, the
  time since the checkpoint it resumed from (all of it when it started fresh). When the run ended
  with a death, the work since its newest checkpoint is counted the same way: a restart redoes it.
- restart: from a death to the job training again (the next attempt's first reported step; its
  start where the job reports no steps): backoff, process start, loading the checkpoint.
- stalled: from the last sign of activity of an attempt (its last reported step, or later output the
  supervisor saw) to its death: a hang's silence, a step cut short.
- overhead: start-up before the first step and shut-down after the last of attempts that did not
  follow or end in a death.

goodput = kept / wall.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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


@dataclass(frozen=True)
class CheckpointMark:
    time: float  # when it was written
    step: int | None
    path: str | None = None


@dataclass
class Loss:
    """What the end of one attempt cost."""

    attempt: int
    cause: str | None  # None: a stop that was asked for (its unsaved steps can still be redone)
    recomputed_s: float = 0.0
    recomputed_steps: int | None = None
    restart_s: float = 0.0
    stalled_s: float = 0.0
    measured_by: str = "steps"  # "steps" | "checkpoints" | "unknown"

    @property
    def total_s(self) -> float:
        return self.recomputed_s + self.restart_s + self.stalled_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "cause": self.cause,
            "recomputed_s": round(self.recomputed_s, 3),
            "recomputed_steps": self.recomputed_steps,
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
    paused_s: float  # between a requested stop and the run's continuation: not in wall_s
    losses: tuple[Loss, ...]
    measured_by: str  # "steps", "checkpoints" or "mixed"

    @property
    def ratio(self) -> float | None:
        return self.kept_s / self.wall_s if self.wall_s > 0 else None

    @property
    def recomputed_s(self) -> float:
        return sum(loss.recomputed_s for loss in self.losses)

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
            "overhead_s": round(self.overhead_s, 3),
            "paused_s": round(self.paused_s, 3),
            "measured_by": self.measured_by,
            "losses": [loss.to_dict() for loss in self.losses],
        }


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


def _cut(segments: list[_Segment], point: _ResumePoint, loss: Loss) -> None:
    """Drop from ``segments`` the training a resume from ``point`` redoes; charge it to ``loss``."""
    removed_s = 0.0
    removed_steps = 0.0
    by_checkpoints = unknown = False
    kept: list[_Segment] = []
    for seg in segments:
        duration = seg.t1 - seg.t0
        if point.fresh:
            if seg.has_steps:
                removed_steps += seg.points[-1][1] - seg.points[0][1]
            else:
                by_checkpoints = True
            seg.points = []
        elif point.step is not None and seg.has_steps:
            removed_steps += seg.keep_until_step(point.step)
        elif point.time is not None:
            by_checkpoints = True
            seg.keep_until_time(point.time)
        else:
            unknown = True  # resumed from a checkpoint of unknown step and time: nothing can be said
        left = seg.points[-1][0] - seg.points[0][0] if len(seg.points) > 1 else 0.0
        removed_s += duration - left
        if left > 0:
            kept.append(seg)
    segments[:] = kept
    loss.recomputed_s += removed_s
    if removed_steps:
        loss.recomputed_steps = (loss.recomputed_steps or 0) + round(removed_steps)
    if unknown:
        loss.measured_by = "unknown"
    elif by_checkpoints:
        loss.measured_by = "checkpoints"


def compute(
    attempts: Iterable[AttemptRecord], checkpoints: Sequence[CheckpointMark], *, now: float, run_active: bool
) -> Goodput:
    """The goodput of one run. ``now`` ends a running attempt; ``run_active`` says whether the run
    may still continue by itself (then a last death is not charged its unsaved work yet)."""
    ordered = sorted(attempts, key=lambda a: a.n)
    segments: list[_Segment] = []
    losses: dict[int, Loss] = {}
    wall = training = overhead = paused = 0.0
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
            _cut(segments, _resume_point(attempt, checkpoints), loss)
        wall += end - start
        reported = attempt.progress
        first_t, last_t = _number(reported.get("first_step_time")), _number(reported.get("step_time"))
        first_s, last_s = _number(reported.get("first_step")), _number(reported.get("step"))
        if None not in (first_t, last_t, first_s, last_s):
            methods.add("steps")
            first = _clamp(first_t, start, end)
            last = _clamp(last_t, first, end)
            if after_death:
                losses[previous.n].restart_s += first - start
            else:
                overhead += first - start
            points = _step_points(first, last, end, float(first_s), float(last_s), checkpoints)
            (t_first, s_first), (t_last, s_last) = points[0], points[-1]
            rate = (t_last - t_first) / (s_last - s_first) if s_last > s_first and t_last > t_first else None
            active_end = t_last
            if attempt.ended_at is None:  # still training since its last report
                active_end = end
            elif attempt.died and reported.get("stop_signal") is None:
                # The job writes its step every few seconds; the supervisor saw it active (its
                # output) until ``last_active_time``: it trained until then, not until its last
                # report, and went silent only after (a hang).
                seen = _number(reported.get("last_active_time"))
                if seen is not None:
                    active_end = _clamp(seen, t_last, end)
            if active_end > t_last:
                points.append((active_end, s_last + (active_end - t_last) / rate if rate else s_last))
            if active_end > first:
                segments.append(_Segment(points))
            training += active_end - first
            tail = end - active_end
            if attempt.died:
                losses.setdefault(attempt.n, Loss(attempt.n, attempt.cause)).stalled_s += tail
            else:
                overhead += tail
        else:
            methods.add("checkpoints")
            segments.append(_Segment([(start, None), (end, None)]))
            training += end - start
        previous, previous_end = attempt, end
    if previous is not None and previous.died and previous.ended_at is not None and not run_active:
        loss = losses.setdefault(previous.n, Loss(previous.n, previous.cause))
        _cut(segments, _newest_before(previous.ended_at, checkpoints), loss)
    kept = sum(seg.t1 - seg.t0 for seg in segments)
    measured_by = "mixed" if len(methods) > 1 else (methods.pop() if methods else "steps")
    ordered_losses = tuple(loss for _, loss in sorted(losses.items()) if loss.cause is not None or loss.total_s > 0)
    return Goodput(wall, training, kept, overhead, paused, ordered_losses, measured_by)


# ---------------------------------------------------------------------------------------------- from records
def attempt_records(attempts: Iterable[Any]) -> list[AttemptRecord]:
    """The registry's attempts (``trainguard.store.registry.Attempt``) as goodput's input."""
    return [
        AttemptRecord(
            n=a.n,
            started_at=a.started_at,
            ended_at=a.ended_at,
            died=a.cause is not None,
            cause=a.cause,
            resumed_from=a.resumed_from,
            progress=a.progress or {},
        )
        for a in attempts
    ]


def checkpoint_marks(events: Iterable[Mapping[str, Any]]) -> list[CheckpointMark]:
    """The checkpoints the supervisor recorded (events of kind ``checkpoint``)."""
    marks = []
    for event in events:
        if event.get("kind") != "checkpoint":
            continue
        step = event.get("step")
        marks.append(CheckpointMark(float(event["time"]), step if isinstance(step, int) else None, event.get("path")))
    return marks


def of_run(run: Any, events: Iterable[Mapping[str, Any]], *, now: float) -> Goodput:
    """The goodput of a registry ``Run`` from its recorded events."""
    return compute(attempt_records(run.attempts), checkpoint_marks(events), now=now, run_active=run.active)


def describe(result: Goodput, lang: str = "en") -> str:
    """One line a person reads: the ratio, the wall time, and what the losses were."""
    from trainguard.units import format_duration as d

    if result.ratio is None:
        return "no attempt has run yet" if lang != "zh" else "尚无已运行的尝试"
    pct = f"{100 * result.ratio:.0f}%"
    lost = result.lost_by_kind()
    if lang == "zh":
        text = f"{pct}（墙钟时间 {d(result.wall_s)} 中保留的训练 {d(result.kept_s)}）"
        if any(lost.values()):
            text += (f"；损失：重算 {d(lost['recomputed'])}，重启 {d(lost['restart'])}，"
                     f"停滞 {d(lost['stalled'])}")  # fmt: skip
        return text
    text = f"{pct} ({d(result.kept_s)} of training kept in {d(result.wall_s)} wall time)"
    if any(lost.values()):
        text += (f"; lost: {d(lost['recomputed'])} recomputed, {d(lost['restart'])} restarting, "
                 f"{d(lost['stalled'])} stalled")  # fmt: skip
    return text


def describe_loss(loss: Loss, lang: str = "en") -> str:
    from trainguard.units import format_duration as d

    if lang == "zh":
        steps = f"（{loss.recomputed_steps} 步）" if loss.recomputed_steps else ""
        cause = loss.cause or "按请求停止"
        return (f"第 {loss.attempt} 次尝试（{cause}）：重算 {d(loss.recomputed_s)}{steps}，重启 {d(loss.restart_s)}，"
                f"停滞 {d(loss.stalled_s)}")  # fmt: skip
    steps = f" ({loss.recomputed_steps} steps)" if loss.recomputed_steps else ""
    cause = loss.cause or "stopped on request"
    return (f"attempt {loss.attempt} ({cause}): {d(loss.recomputed_s)} recomputed{steps}, "
            f"{d(loss.restart_s)} restarting, {d(loss.stalled_s)} stalled")  # fmt: skip
