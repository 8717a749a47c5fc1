"""When a resource a job can run out of will run out, projected from recent readings, and the decisions
made on that projection: how soon to read it again, whether to ask the job to save now, and whether the
job's own memory is leaking toward its limit (met by a planned restart). Pure: readings in, a decision
out; no clock and no I/O."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from trainguard.monitor.sampler import Sample
from trainguard.units import format_duration, format_size

# Resource names. A disk is "disk:<path>" and a GPU "gpu<index>", so each has its own projection.
JOB_MEMORY = "job_memory"  # the job's own memory (its cgroup, or its process tree) against what it may take
HOST_MEMORY = "host_memory"  # the machine's RAM (or the supervisor's cgroup) against its total
SHM = "shm"
DISK_PREFIX = "disk:"
GPU_PREFIX = "gpu"

TREND_SEGMENTS = 4  # a steady trend rises from each quarter of the window to the next
MAX_FIT_POINTS = 60  # Theil-Sen compares every pair: thin longer windows to this many readings
SAMPLES_BEFORE_EXHAUSTION = 20  # sample fast enough to see this many readings before the projected end
NEAR_LIMIT_ROOM = 0.5  # below this share of the limit still free, sampling speeds up toward the fastest


class Reading(NamedTuple):
    """One reading of one resource: bytes in use against the bytes it may reach."""

    time: float  # seconds
    used: float  # bytes
    limit: float  # bytes


@dataclass(frozen=True)
class TrendRules:
    """How much history, and how steady, a trend needs before it is projected."""

    window_s: float = 120.0  # only the readings this recent count
    min_span_s: float = 10.0  # the readings must cover at least this long
    min_samples: int = 8
    min_fit: float = 0.9  # the share of the readings' variation the straight line explains (R²)
    lookahead: float = 5.0  # project no further ahead than this many times the history covered


DEFAULT_RULES = TrendRules()


@dataclass(frozen=True)
class Projection:
    """A resource growing steadily toward its limit, and when it gets there at this rate."""

    resource: str
    rate_bytes_per_s: float
    seconds_to_exhaustion: float  # from the newest reading
    used: float  # bytes at the newest reading
    limit: float  # bytes it runs out at (the limit less any reserve asked for)
    span_s: float  # the history the trend was drawn from
    samples: int
    fit: float  # R² of the trend, 0..1: how steady the growth is
    why: str

    @property
    def confidence(self) -> float:
        return self.fit


@dataclass(frozen=True)
class Leak:
    """The job's own memory growing steadily toward its limit: save, exit and start fresh."""

    resource: str
    rate_bytes_per_s: float
    seconds_to_exhaustion: float
    used: float
    limit: float
    evidence: str  # one line for the diagnosis: the growth rate and where it was measured


def _theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Slope and intercept: the median of the pairwise slopes, so that a spike or a dropped reading
    does not tilt the line as it tilts least squares."""
    slopes = [(y2 - y1) / (t2 - t1) for i, (t1, y1) in enumerate(points) for t2, y2 in points[i + 1 :] if t2 > t1]
    if not slopes:
        return 0.0, points[-1][1]
    slope = statistics.median(slopes)
    return slope, statistics.median(y - slope * t for t, y in points)


def _fit(points: Sequence[tuple[float, float]], slope: float, intercept: float) -> float:
    mean = statistics.fmean(y for _, y in points)
    total = sum((y - mean) ** 2 for _, y in points)
    if total == 0:
        return 0.0
    residual = sum((y - (slope * t + intercept)) ** 2 for t, y in points)
    return max(0.0, 1.0 - residual / total)


def _rises_through_the_window(points: Sequence[tuple[float, float]]) -> bool:
    """Each part of the window sits higher than the one before: a rise that then falls back (an
    epoch's peak, one spike) is not a trend however the line fits."""
    start, span = points[0][0], points[-1][0] - points[0][0]
    if span <= 0:
        return False
    parts: list[list[float]] = [[] for _ in range(TREND_SEGMENTS)]
    for t, y in points:
        parts[min(TREND_SEGMENTS - 1, int((t - start) / span * TREND_SEGMENTS))].append(y)
    medians = [statistics.median(part) for part in parts if part]
    return len(medians) >= TREND_SEGMENTS - 1 and all(b > a for a, b in pairwise(medians))


def _thinned(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_FIT_POINTS:
        return points
    step = (len(points) - 1) / (MAX_FIT_POINTS - 1)
    return [points[round(i * step)] for i in range(MAX_FIT_POINTS)]


def project(resource: str, readings: Sequence[Reading], rules: TrendRules = DEFAULT_RULES, *,
            reserve_bytes: float = 0.0) -> Projection | None:  # fmt: skip
    """When ``resource`` runs out at its present steady growth, or None when its recent readings show
    no steady growth: too little history, a flat or falling series, noise, a rise that fell back.
    The whole window is tried first, then its newer half, quarter, ... down to ``min_span_s``: a
    growth that began lately is not hidden by the flat readings before it (once it rises above them),
    and the longest history that shows it steady is the one projected. ``reserve_bytes`` must stay
    free (the next checkpoint on the checkpoint disk): the projection ends there. ``readings`` are
    oldest first."""
    if not readings:
        return None
    newest = readings[-1].time
    whole = [r for r in readings if newest - r.time <= rules.window_s]
    window, tried = rules.window_s, -1
    while window >= rules.min_span_s:
        recent = [r for r in whole if newest - r.time <= window]
        if len(recent) != tried:
            tried = len(recent)
            found = _project_recent(resource, recent, rules, reserve_bytes)
            # A rise that has not passed where the window's older readings already were is an
            # epoch's climb back to its usual peak, not a trend toward the limit.
            older_peak = max((r.used for r in whole[: len(whole) - len(recent)]), default=-math.inf)
            if found is not None and found.used > older_peak:
                return found
        window /= 2
    return None


def _project_recent(resource: str, recent: Sequence[Reading], rules: TrendRules,
                    reserve_bytes: float) -> Projection | None:  # fmt: skip
    newest = recent[-1]
    span = newest.time - recent[0].time
    if len(recent) < rules.min_samples or span < rules.min_span_s:
        return None
    # Times from the window's start: epoch seconds times a rate in bytes would lose precision.
    points = _thinned([(r.time - recent[0].time, float(r.used)) for r in recent])
    slope, intercept = _theil_sen(points)
    if slope <= 0:
        return None
    fit = _fit(points, slope, intercept)
    if fit < rules.min_fit or not _rises_through_the_window(points):
        return None
    limit = newest.limit - reserve_bytes
    # The later of what was read and what the line says, so one low reading does not buy time.
    used = max(float(newest.used), slope * span + intercept)
    seconds = max(0.0, (limit - used) / slope)
    if seconds > rules.lookahead * span:
        return None  # too far ahead to say from this little history
    why = (f"{resource} rising {format_size(slope)}/s for {format_duration(span)} ({len(recent)} readings, "
           f"fit {fit:.2f}): {format_size(max(0.0, limit - used))} left of {format_size(limit)}, "
           f"gone in {format_duration(seconds)}")  # fmt: skip
    return Projection(resource, slope, seconds, used, limit, span, len(recent), fit, why)


def readings_from_samples(samples: Sequence[Sample]) -> dict[str, list[Reading]]:
    """Each resource the samples measured, as readings: the host's memory, the job's own memory
    against what it may still take (its RSS plus what is available to it), /dev/shm, each disk (its
    free bytes against the most room seen: a sample does not hold the disk's size) and each GPU."""
    series: dict[str, list[Reading]] = {}

    def add(resource: str, time: float, used: float, limit: float) -> None:
        series.setdefault(resource, []).append(Reading(time, used, limit))

    most_free: dict[str, int] = {}
    for sample in samples:
        for path, free in sample.disk_free.items():
            most_free[path] = max(free, most_free.get(path, 0))
    for s in samples:
        if s.mem_available is not None and s.mem_total:
            add(HOST_MEMORY, s.time, s.mem_total - s.mem_available, s.mem_total)
            if s.job_rss is not None:
                add(JOB_MEMORY, s.time, s.job_rss, s.job_rss + s.mem_available)
        if s.shm_used is not None and s.shm_total:
            add(SHM, s.time, s.shm_used, s.shm_total)
        for path, free in s.disk_free.items():
            add(DISK_PREFIX + path, s.time, most_free[path] - free, most_free[path])
        for gpu in s.gpus:
            if gpu.memory_total:
                add(f"{GPU_PREFIX}{gpu.index}", s.time, gpu.memory_used, gpu.memory_total)
    return series


def project_all(samples: Sequence[Sample], rules: TrendRules = DEFAULT_RULES, *,
                reserve_bytes: Mapping[str, float] | None = None) -> dict[str, Projection]:  # fmt: skip
    """The projection of every resource the samples show growing steadily."""
    reserve = reserve_bytes or {}
    found = {}
    for resource, readings in readings_from_samples(samples).items():
        projection = project(resource, readings, rules, reserve_bytes=reserve.get(resource, 0.0))
        if projection is not None:
            found[resource] = projection
    return found


def sampling_interval(latest: Reading | None, projection: Projection | None, *,
                      slowest_s: float = 5.0, fastest_s: float = 0.25) -> float:  # fmt: skip
    """Seconds until the next reading: ``slowest_s`` far from the limit, shrinking toward
    ``fastest_s`` as the free share falls below NEAR_LIMIT_ROOM and as the projected end nears, so
    that a decision still has readings to stand on before the end."""
    interval = slowest_s
    if latest is not None and latest.limit > 0:
        room = min(1.0, max(0.0, 1.0 - latest.used / latest.limit))
        if room < NEAR_LIMIT_ROOM:
            interval = fastest_s + (slowest_s - fastest_s) * room / NEAR_LIMIT_ROOM
    if projection is not None:
        interval = min(interval, projection.seconds_to_exhaustion / SAMPLES_BEFORE_EXHAUSTION)
    return min(slowest_s, max(fastest_s, interval))


def should_request_save(projection: Projection | None, save_seconds: float, margin_s: float,
                        last_request_time: float | None, now: float) -> bool:  # fmt: skip
    """Ask the job to save now: the resource runs out sooner than a save takes plus ``margin_s``.
    Never sooner after the last request than that save could finish and its margin pass: a job asked
    again while it saves would do nothing but save."""
    if projection is None or projection.seconds_to_exhaustion > save_seconds + margin_s:
        return False
    return last_request_time is None or now - last_request_time >= save_seconds + margin_s


def judge_leak(projection: Projection | None, save_seconds: float, margin_s: float, *,
               measured_at: str = "the job's memory") -> Leak | None:  # fmt: skip
    """A leak: the job's own memory (not the host's, not a disk) grows steadily and reaches its limit
    sooner than a save takes plus ``margin_s``. Saving and going on cannot help it; the job saves,
    exits and starts fresh from that checkpoint. ``measured_at`` says where (a cgroup's
    memory.current, the process tree's RSS) for the diagnosis."""
    if projection is None or projection.resource != JOB_MEMORY:
        return None
    if projection.seconds_to_exhaustion > save_seconds + margin_s:
        return None
    evidence = (f"{measured_at} grew {format_size(projection.rate_bytes_per_s)}/s for "
                f"{format_duration(projection.span_s)} (fit {projection.fit:.2f}) to {format_size(projection.used)} "
                f"of {format_size(projection.limit)}, "
                f"{format_duration(projection.seconds_to_exhaustion)} from the limit")  # fmt: skip
    return Leak(projection.resource, projection.rate_bytes_per_s, projection.seconds_to_exhaustion,
                projection.used, projection.limit, evidence)  # fmt: skip


@dataclass(frozen=True)
class Ahead:
    """What to ask of the job now: save and go on (a resource runs out soon, and a checkpoint taken
    now is what the death would otherwise cost), or, for a leak, save and stop so that it starts
    fresh from that checkpoint."""

    projection: Projection  # the resource that runs out soonest
    leak: Leak | None

    @property
    def then(self) -> str:
        return "stop" if self.leak else "continue"


def look_ahead(series: Mapping[str, Sequence[Reading]], save_seconds: float, margin_s: float, *,
               last_request_time: float | None, now: float, reserve_bytes: Mapping[str, float] | None = None,
               rules: TrendRules = DEFAULT_RULES, measured_at: str = "the job's memory") -> Ahead | None:  # fmt: skip
    """The request to make now, from each resource's recent readings (oldest first), or None: no
    resource runs out sooner than a save takes plus ``margin_s``, or the last request is too recent
    for its save to have finished. A leak of the job's own memory is met by a stop, however soon
    another resource runs out: saving and going on would meet the same limit again."""
    reserve = reserve_bytes or {}
    projections = [p for resource, readings in series.items()
                   if (p := project(resource, readings, rules, reserve_bytes=reserve.get(resource, 0.0)))]  # fmt: skip
    if not projections:
        return None
    soonest = min(projections, key=lambda p: p.seconds_to_exhaustion)
    if not should_request_save(soonest, save_seconds, margin_s, last_request_time, now):
        return None
    job = next((p for p in projections if p.resource == JOB_MEMORY), None)
    return Ahead(soonest, judge_leak(job, save_seconds, margin_s, measured_at=measured_at))
