"""Acting on a death the supervisor sees coming, for one attempt: the resources a job can run out of
are read often (the job's own memory from its cgroup, the checkpoint disk and /dev/shm from one
statvfs each; faster as a limit nears), the others come from the run's samples (the host's memory,
the GPUs), and when ``forecast.look_ahead`` says one runs out sooner than a save takes, the job is
asked to save now through its save-request file (``checkpoint.saverequest``): to go on, or, for a
leak of its own memory, to stop so that the next attempt starts fresh from that save. Each request
is an event of the run, an alert and a line in the attempt's log. The decisions are the forecast's;
this module only reads and writes."""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from trainguard import progress
from trainguard._i18n import Text
from trainguard.checkpoint.saverequest import SaveRequest, write_request
from trainguard.monitor import forecast
from trainguard.monitor.forecast import Ahead, Leak, Reading
from trainguard.monitor.runwatch import RunMonitor
from trainguard.monitor.sampler import tree_rss
from trainguard.probes.memory import available_bytes
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt
from trainguard.supervisor.attempt_files import append_marker, progress_file, save_request_file
from trainguard.supervisor.containment import Containment
from trainguard.supervisor.job import JobOptions
from trainguard.units import format_duration

log = logging.getLogger("trainguard.supervisor")

FASTEST_S = 0.25  # a reading of a cgroup or a statvfs costs microseconds
SLOWEST_S = 1.0
DEFAULT_SAVE_S = 10.0  # until a request is answered: the wait for a step's end, and the save
MARGIN_S = 5.0
FROM_SAMPLES = (forecast.HOST_MEMORY, forecast.GPU_PREFIX)  # what only the run's samples measure


@dataclass(frozen=True)
class PlannedStop:
    """The stop asked of a leaking job: the request's id, and the leak that it answers."""

    request_id: int
    leak: Leak


class Foresight:
    """One attempt's look ahead. ``tick`` is called on every turn of the watch loop; ``due_in`` says
    how soon it wants the next one."""

    def __init__(self, *, journal: Journal, monitor: RunMonitor, n: int, request_file: str, progress_file: str,
                 log_path: str | None, readers: dict[str, Callable[[], Reading | None]], measured_at: str,
                 reserve_bytes: Callable[[], dict[str, float]], clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.journal, self.monitor, self.n = journal, monitor, n
        self.request_file, self.progress_file, self.log_path = request_file, progress_file, log_path
        self.readers, self.measured_at, self.reserve_bytes = readers, measured_at, reserve_bytes
        self.clock, self.wall = clock, wall
        self.series: dict[str, deque[Reading]] = {name: deque() for name in readers}
        self.save_seconds = DEFAULT_SAVE_S
        self.planned_stop: PlannedStop | None = None
        self._next_reading = clock()
        self._last_request: SaveRequest | None = None
        self._answered = -1
        self._projections: dict[str, forecast.Projection | None] = {}

    def due_in(self, now: float) -> float:
        return max(0.0, self._next_reading - now)

    def tick(self, now: float) -> None:
        if now < self._next_reading:
            return
        wall = self.wall()
        interval = SLOWEST_S
        for name, read in self.readers.items():
            reading = read()
            if reading is None:
                continue
            readings = self.series[name]
            readings.append(reading)
            while readings and wall - readings[0].time > forecast.DEFAULT_RULES.window_s:
                readings.popleft()
            interval = min(interval, forecast.sampling_interval(reading, self._projections.get(name),
                                                                slowest_s=SLOWEST_S, fastest_s=FASTEST_S))  # fmt: skip
        self._next_reading = now + interval
        self._learn_save_cost()
        if self.planned_stop is not None:
            return  # the job is stopping: nothing more to ask of it
        series = {**{name: list(readings) for name, readings in self.series.items()}, **self._sampled()}
        for name, readings in series.items():
            self._projections[name] = forecast.project(name, readings) if name in self.series else None
        ahead = forecast.look_ahead(series, self.save_seconds, MARGIN_S, now=wall, reserve_bytes=self.reserve_bytes(),
                                    last_request_time=self._last_request.time if self._last_request else None,
                                    measured_at=self.measured_at)  # fmt: skip
        if ahead is not None:
            self._request(ahead, wall)

    def _sampled(self) -> dict[str, list[Reading]]:
        """The host's memory and the GPUs, from the run's samples (NVML is not read several times a second)."""
        found = forecast.readings_from_samples(list(self.monitor.recent))
        return {name: readings for name, readings in found.items() if name.startswith(FROM_SAMPLES)}

    def _request(self, ahead: Ahead, wall: float) -> None:
        projection = ahead.projection
        request_id = (self._last_request.id if self._last_request else 0) + 1
        left = format_duration(projection.seconds_to_exhaustion)
        reason = (ahead.leak.evidence if ahead.leak else projection.why)[:500]
        request = SaveRequest(request_id, wall, reason, stop=ahead.leak is not None)
        try:
            write_request(self.request_file, request)
        except OSError as exc:  # the state disk is full: the request cannot be made; said once a request
            log.warning("cannot write the save request %s: %s", self.request_file, exc.strerror or exc)
            return
        self._last_request = request
        if ahead.leak is not None:
            self.planned_stop = PlannedStop(request_id, ahead.leak)
            evidence = ahead.leak.evidence
            rule = "memory_leak"
            en = f"the job's memory leaks: asked it to save and stop, to start fresh ({evidence})"
            zh = f"作业内存泄漏：已请求它保存检查点后停止，再全新启动（{evidence}）"
        else:
            rule, what = "save_ahead", projection.resource
            en = f"{what} runs out in {left}: asked the job to save now ({projection.why})"
            zh = f"{what} 将在 {left} 内耗尽：已请求作业立即保存检查点（{projection.why}）"
        self.journal.event("save_ahead", {"attempt": self.n, "id": request_id, "resource": projection.resource,
                                          "seconds_left": projection.seconds_to_exhaustion, "then": ahead.then,
                                          "why": reason})  # fmt: skip
        self.monitor.alert(rule, "warning", en=en, zh=zh)
        append_marker(self.log_path, Text(en, zh))

    def _learn_save_cost(self) -> None:
        """How long the job took to answer the last request (to its step's end, and the save): the
        save time the next decision plans for."""
        request = self._last_request
        if request is None or request.id <= self._answered:
            return
        report = progress.read(self.progress_file)
        done, saved_at = report.get("save_request_done"), report.get("save_request_time")
        if isinstance(done, int) and done >= request.id and isinstance(saved_at, (int, float)):
            self._answered = done
            self.save_seconds = max(1.0, float(saved_at) - request.time)
            step = report.get("save_request_step")
            self.journal.event("save_ahead_done", {"attempt": self.n, "id": done, "step": step,
                                                   "seconds": self.save_seconds})  # fmt: skip

    def planned_stop_done(self, report: dict) -> PlannedStop | None:
        """The planned stop of a leak, when the job saved for it (its progress ``report`` says so)."""
        done = report.get("save_request_done")
        stop = self.planned_stop
        return stop if stop is not None and isinstance(done, int) and done >= stop.request_id else None


def job_memory_reader(containment: Containment, job_pid: int) -> tuple[Callable[[], Reading | None], str]:
    """How the job's own memory is read, and where (for the diagnosis): its memory cgroup's
    unreclaimable bytes against its limit, else its process tree's resident memory; without a
    limit of its own, against what it holds plus what the machine has available."""
    groups = containment.groups
    held = groups.memory_held() if groups is not None else None
    if groups is not None and held is not None:
        where = "the job's memory cgroup (anon + shmem of memory.stat)"

        def used() -> int | None:
            return groups.memory_held()
    else:
        where = "the job's process tree (resident memory)"

        def used() -> int | None:
            return tree_rss(job_pid)

    limit = groups.limit if groups is not None else None

    def read() -> Reading | None:
        now, in_use = time.time(), used()
        if in_use is None:
            return None
        if limit:
            return Reading(now, in_use, limit)
        available = available_bytes()
        return Reading(now, in_use, in_use + available) if available is not None else None

    return read, where


def disk_reader(path: str) -> Callable[[], Reading | None]:
    """A filesystem's bytes in use against what this user may fill (root's reserve left out)."""

    def read() -> Reading | None:
        try:
            fs = os.statvfs(path)
        except OSError:
            return None
        used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        return Reading(time.time(), used, used + fs.f_bavail * fs.f_frsize) if fs.f_blocks else None

    return read


RESERVE_EVERY_S = 10.0  # the newest checkpoint's size is measured again this often


def foresight_for(journal: Journal, monitor: RunMonitor, options: JobOptions, attempt: Attempt,
                  containment: Containment, job_pid: int, *,
                  checkpoint_bytes: Callable[[], int | None]) -> Foresight:  # fmt: skip
    """The look ahead of a new attempt: its job's memory, the checkpoint disk (which must keep room
    for one more checkpoint of the newest one's size) and /dev/shm read often."""
    read_memory, measured_at = job_memory_reader(containment, job_pid)
    disk = forecast.DISK_PREFIX + options.checkpoint_dir
    readers = {forecast.JOB_MEMORY: read_memory, disk: disk_reader(options.checkpoint_dir),
               forecast.SHM: disk_reader("/dev/shm")}  # fmt: skip
    measured: list[float] = [-RESERVE_EVERY_S, 0.0]  # when, and the bytes

    def reserve() -> dict[str, float]:
        now = time.monotonic()
        if now - measured[0] >= RESERVE_EVERY_S:
            measured[:] = [now, float(checkpoint_bytes() or 0)]
        return {disk: measured[1]}

    run_dir = journal.run.run_dir
    return Foresight(journal=journal, monitor=monitor, n=attempt.n, request_file=save_request_file(run_dir, attempt.n),
                     progress_file=progress_file(run_dir, attempt.n), log_path=attempt.log_path, readers=readers,
                     measured_at=measured_at, reserve_bytes=reserve)  # fmt: skip
