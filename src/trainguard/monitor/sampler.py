"""Taking samples of what kills jobs while a job runs: host RAM and swap, the job's process-tree RSS,
/dev/shm, free disk where the log and checkpoints go, and per GPU memory, utilisation, temperature,
power and throttle reasons. Cheap readings every tick; the process tree less often. Never raises:
a reading that fails is left out of the sample."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from trainguard.probes.memory import available_bytes, cgroup_limit


@dataclass(frozen=True)
class GpuSample:
    index: int
    memory_used: int  # bytes
    memory_total: int  # bytes
    utilization: int | None = None  # percent
    temperature_c: int | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None


@dataclass(frozen=True)
class GpuDetails:
    name: str | None
    power_limit_w: float | None
    processes: tuple[tuple[int, int | None], ...]  # (pid, GPU memory in bytes or None when NVML cannot say)


@dataclass(frozen=True)
class Sample:
    time: float  # seconds since the epoch
    mem_available: int | None = None  # bytes the host (or the job's cgroup) still has
    mem_total: int | None = None
    swap_used: int | None = None
    job_rss: int | None = None  # bytes, the job's whole process tree
    shm_used: int | None = None
    shm_total: int | None = None
    disk_free: dict[str, int] = field(default_factory=dict)  # path -> bytes
    gpus: tuple[GpuSample, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "gpus" and v not in (None, {})}
        if self.gpus:
            data["gpus"] = [{k: v for k, v in g.__dict__.items() if v is not None} for g in self.gpus]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        gpus = tuple(GpuSample(**g) for g in data.get("gpus", ()))
        return cls(**{k: v for k, v in data.items() if k != "gpus"}, gpus=gpus)


class _Nvml:
    """NVML, started once and lazily; "no driver" is remembered, not retried every tick."""

    def __init__(self) -> None:
        self.handles: list[tuple[int, Any]] | None = None
        self.pynvml: Any = None

    def start(self) -> bool:
        if self.handles is not None:
            return bool(self.handles)
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            visible = _visible_indices(pynvml.nvmlDeviceGetCount())
            self.handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in visible]
        except Exception:
            self.handles = []
        return bool(self.handles)

    def details(self) -> dict[int, GpuDetails]:
        """Per GPU: its name, power limit and the processes using it (NVML per-process info)."""
        if not self.start():
            return {}
        nv = self.pynvml
        found = {}
        for index, handle in self.handles or ():
            name: str | None = None
            with contextlib.suppress(nv.NVMLError, AttributeError):
                raw = nv.nvmlDeviceGetName(handle)
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
            limit = None
            with contextlib.suppress(nv.NVMLError, AttributeError):
                limit = nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000
            processes: dict[int, int | None] = {}
            for function in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                with contextlib.suppress(nv.NVMLError, AttributeError):
                    for proc in getattr(nv, function)(handle):
                        used = getattr(proc, "usedGpuMemory", None)
                        # NVML reports "not available" (in a container without the host's pid
                        # namespace, under MIG) as a huge sentinel.
                        processes[int(proc.pid)] = used if isinstance(used, int) and used < 1 << 60 else None
            found[index] = GpuDetails(name, limit, tuple(processes.items()))
        return found

    def sample(self) -> tuple[GpuSample, ...]:
        if not self.start():
            return ()
        nv = self.pynvml
        found = []
        for index, handle in self.handles or ():
            try:
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
            except nv.NVMLError:
                continue

            def read(function: str, *args: Any, handle: Any = handle) -> Any:
                with contextlib.suppress(nv.NVMLError, AttributeError):
                    return getattr(nv, function)(handle, *args)
                return None

            utilization = read("nvmlDeviceGetUtilizationRates")
            power = read("nvmlDeviceGetPowerUsage")  # milliwatts
            found.append(
                GpuSample(
                    index=index,
                    memory_used=memory.used,
                    memory_total=memory.total,
                    utilization=utilization.gpu if utilization is not None else None,
                    temperature_c=read("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU),
                    power_w=power / 1000 if power is not None else None,
                    throttle_reasons=read("nvmlDeviceGetCurrentClocksEventReasons"),
                )
            )
        return tuple(found)


def _visible_indices(count: int) -> list[int]:
    """The GPUs the job can see: CUDA_VISIBLE_DEVICES as indices, else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return list(range(count))
    indices = [int(part) for part in visible.split(",") if part.strip().isdigit()]
    return [i for i in indices if i < count] or list(range(count))


class Sampler:
    def __init__(self, *, disk_paths: list[str], tree_every: int = 6) -> None:
        self.disk_paths = disk_paths
        self.tree_every = tree_every
        self._ticks = 0
        self._last_rss: int | None = None
        self._nvml = _Nvml()

    def warm_up(self) -> None:
        self._nvml.start()

    def gpu_details(self) -> dict[int, GpuDetails]:
        """Name, power limit and processes of each GPU (empty without NVML)."""
        return self._nvml.details()

    def sample(self, job_pid: int | None) -> Sample:
        self._ticks += 1
        memory = swap = None
        with contextlib.suppress(Exception):
            memory = psutil.virtual_memory()
            swap = psutil.swap_memory()
        # What the job can still take: the machine's MemAvailable, or less under a cgroup limit.
        available = available_bytes()
        limit = None
        with contextlib.suppress(OSError):
            limit = cgroup_limit(Path("/proc/self/cgroup").read_text())
        shm_used = shm_total = None
        with contextlib.suppress(OSError):
            usage = shutil.disk_usage("/dev/shm")
            shm_used, shm_total = usage.used, usage.total
        disk_free = {}
        for path in self.disk_paths:
            with contextlib.suppress(OSError):
                disk_free[path] = shutil.disk_usage(path).free
        if job_pid is not None and (self._last_rss is None or self._ticks % self.tree_every == 0):
            self._last_rss = tree_rss(job_pid)
        return Sample(
            time=time.time(),
            mem_available=available if available is not None else (memory.available if memory else None),
            mem_total=min(limit, memory.total) if limit and memory else (memory.total if memory else limit),
            swap_used=swap.used if swap else None,
            job_rss=self._last_rss,
            shm_used=shm_used,
            shm_total=shm_total,
            disk_free=disk_free,
            gpus=self._nvml.sample(),
        )


def tree_rss(pid: int) -> int | None:
    """The resident memory of ``pid`` and all its descendants, bytes; None when it is gone."""
    try:
        root = psutil.Process(pid)
        total = root.memory_info().rss
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total
    except psutil.Error:
        return None
