"""Reading the world for `trainguard top`, cheaply enough to do every second or two: the registry
(runs, their newest checkpoint, the alert that still stands), each active attempt's progress file,
the job's process tree RSS, NVML directly (GPUs and the processes on them), psutil for host RAM and
swap, statvfs for /dev/shm and the disks. Goodput of ended runs is computed once and kept."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from trainguard import goodput, progress
from trainguard.monitor.sampler import Sampler, tree_rss
from trainguard.monitor.standing import EVENT_KINDS, standing_alert
from trainguard.store.registry import Registry, Run
from trainguard.top.model import (
    DiskView,
    GpuProcessView,
    GpuView,
    HostView,
    RunView,
    Snapshot,
    order_runs,
    owner_of,
    run_view,
    throttle_names,
)


class Collector:
    def __init__(self, registry: Registry, *, lang: str = "en", clock: Callable[[], float] = time.time) -> None:
        self.registry = registry
        self.lang = lang
        self.clock = clock
        self.sampler = Sampler(disk_paths=[])
        self._goodput_done: dict[str, tuple[tuple[str, int], float | None]] = {}  # ended runs: key -> ratio
        self._runs: dict[str, Run] = {}

    def run(self, run_id: str) -> Run | None:
        """The record of a run shown in the last snapshot (read fresh)."""
        return self.registry.get(run_id)

    def snapshot(self) -> Snapshot:
        now = self.clock()
        errors: list[str] = []
        host = self._host()
        runs: list[Run] = []
        try:
            runs = self.registry.all()
        except Exception as exc:  # a registry being rewritten: show the rest, say so
            errors.append(str(exc))
        self._runs = {r.id: r for r in runs}
        views = [self._run_view(run, now, host.mem_total) for run in runs]
        gpus, note = self._gpus(runs)
        return Snapshot(time=now, runs=tuple(order_runs(views)), gpus=gpus, host=host, gpu_note=note,
                        hostname=socket.gethostname(), state_dir=str(self.registry.state_dir),
                        errors=tuple(errors))  # fmt: skip

    # ------------------------------------------------------------------ runs
    def _run_view(self, run: Run, now: float, machine_memory: int | None) -> RunView:
        current = run.attempts[-1] if run.attempts else None
        reported = None
        rss = None
        if run.active and current is not None and current.ended_at is None:
            fresh = progress.read(os.path.join(run.run_dir, f"attempt-{current.n}.progress.json"))
            reported = fresh or current.progress
            if current.pid:
                rss = tree_rss(current.pid)
        newest = self.registry.latest_event(run.id, "checkpoint")
        # An ended run has no standing alert (its state and cause say how it ended): nothing to read.
        alert = standing_alert(self.registry.events(run.id, kinds=EVENT_KINDS), now=now) if run.active else None
        return run_view(run, now=now, reported=reported, newest_checkpoint=newest, rss=rss,
                        machine_memory=machine_memory, alert=alert, goodput=self._goodput(run, now),
                        lang=self.lang)  # fmt: skip

    def _goodput(self, run: Run, now: float) -> float | None:
        key = (run.state, len(run.attempts))
        kept = self._goodput_done.get(run.id)
        if kept is not None and kept[0] == key:
            return kept[1]
        result = goodput.of_run(run, self.registry.events(run.id, kinds=("checkpoint",)), now=now)
        if not run.active:  # an ended run's figures do not change
            self._goodput_done[run.id] = (key, result.ratio)
        return result.ratio

    # ------------------------------------------------------------------ GPUs
    def _gpus(self, runs: list[Run]) -> tuple[tuple[GpuView, ...], str | None]:
        samples = self.sampler.sample(None).gpus
        if not samples:
            return (), "no NVIDIA GPU visible (no driver, or NVML cannot be loaded)"
        details = self.sampler.gpu_details()
        job_pids = {r.job_pid: r.id for r in runs if r.active and r.job_pid}
        names = {r.id: r.name for r in runs}
        views = []
        for gpu in samples:
            detail = details.get(gpu.index)
            processes = []
            for pid, used in detail.processes if detail else ():
                owner = owner_of(_cgroup_text(pid), _ancestors(pid), job_pids)
                run_id = owner[0] if owner else None
                processes.append(GpuProcessView(pid, used, _command(pid), run_id, names.get(run_id)))
            views.append(GpuView(gpu.index, detail.name if detail else None, gpu.memory_used, gpu.memory_total,
                                 gpu.utilization, gpu.temperature_c, gpu.power_w,
                                 detail.power_limit_w if detail else None, throttle_names(gpu.throttle_reasons),
                                 tuple(processes)))  # fmt: skip
        return tuple(views), None

    # ------------------------------------------------------------------ host
    def _host(self) -> HostView:
        memory = swap = None
        with contextlib.suppress(Exception):
            memory = psutil.virtual_memory()
            swap = psutil.swap_memory()
        shm = None
        with contextlib.suppress(OSError):
            shm = shutil.disk_usage("/dev/shm")
        disks = []
        seen: set[int] = set()
        folders = [("state", str(self.registry.state_dir))]
        folders += [(r.name or r.id, r.options["checkpoint_dir"]) for r in self._runs.values()
                    if r.active and r.options.get("checkpoint_dir")]  # fmt: skip
        for label, path in folders:
            with contextlib.suppress(OSError):
                device = os.stat(path).st_dev
                if device in seen:
                    continue
                seen.add(device)
                usage = shutil.disk_usage(path)
                disks.append(DiskView(label, path, usage.free, usage.total))
        return HostView(
            mem_total=memory.total if memory else None,
            mem_available=memory.available if memory else None,
            swap_total=swap.total if swap else None,
            swap_used=swap.used if swap else None,
            shm_total=shm.total if shm else None,
            shm_used=shm.used if shm else None,
            disks=tuple(disks),
        )


def _cgroup_text(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None


def _ancestors(pid: int, limit: int = 32) -> list[int]:
    found = []
    with contextlib.suppress(psutil.Error):
        for parent in psutil.Process(pid).parents()[:limit]:
            found.append(parent.pid)
    return [pid, *found]


def _command(pid: int) -> str | None:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).name()
    return None


def log_tail(run: Run, lines: int = 200, max_bytes: int = 256 * 1024) -> tuple[str | None, list[str]]:
    """The last ``lines`` lines of the run's current attempt's log: (its path, the lines)."""
    from trainguard.store.runlogs import attempt_region

    if not run.attempts:
        return None, []
    region = attempt_region(run, run.attempts[-1])
    try:
        with open(region.path, "rb") as log:
            end = region.end if region.end is not None else os.fstat(log.fileno()).st_size
            start = max(region.start, end - max_bytes)
            log.seek(start)
            data = log.read(end - start)
    except OSError:
        return region.path, []
    text = data.decode("utf-8", errors="replace").replace("\r", "\n")
    return region.path, text.splitlines()[-lines:]
