"""Prometheus metrics of runs, GPUs and the host (``trainguard exporter``, ``run --metrics-port``).
Every name starts with ``trainguard_`` and carries its unit; Xid errors are a counter by code, not a
sticky gauge. Gauges come from a table, not one hand-written function each."""

from __future__ import annotations

import errno
import itertools
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trainguard.errors import UsageError
from trainguard.monitor.metrics_server import MetricsServer
from trainguard.monitor.sampler import GpuSample, Sample, Sampler
from trainguard.store.registry import Registry

HOST = socket.gethostname()

# (metric, help, value from a host sample)
HOST_GAUGES: list[tuple[str, str, Callable[[Sample], float | None]]] = [
    ("trainguard_host_memory_available_bytes", "Memory the jobs can still take (MemAvailable, or less under a cgroup limit)", lambda s: s.mem_available),
    ("trainguard_host_memory_total_bytes", "Host RAM, or the cgroup limit when lower", lambda s: s.mem_total),
    ("trainguard_host_swap_used_bytes", "Swap in use", lambda s: s.swap_used),
    ("trainguard_shm_used_bytes", "/dev/shm in use", lambda s: s.shm_used),
    ("trainguard_shm_size_bytes", "/dev/shm size", lambda s: s.shm_total),
]  # fmt: skip
# (metric, help, value from a GPU sample)
GPU_GAUGES: list[tuple[str, str, Callable[[GpuSample], float | None]]] = [
    ("trainguard_gpu_memory_used_bytes", "GPU memory in use", lambda g: g.memory_used),
    ("trainguard_gpu_memory_total_bytes", "GPU memory", lambda g: g.memory_total),
    ("trainguard_gpu_utilization_ratio", "GPU utilisation, 0..1", lambda g: None if g.utilization is None else g.utilization / 100),
    ("trainguard_gpu_temperature_celsius", "GPU temperature", lambda g: g.temperature_c),
    ("trainguard_gpu_power_watts", "GPU power draw", lambda g: g.power_w),
]  # fmt: skip
# NVML clocks-event reasons (tools/reference/nvml_throttle.json)
THROTTLE_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake",
                    0x100: "display_clocks"}  # fmt: skip


class TrainguardCollector(Collector):
    def __init__(
        self, registry: Registry | None, *, run_id: str | None = None, xid_counts: Callable[[], Counter] | None = None
    ) -> None:
        self.registry = registry
        self.run_id = run_id
        self.sampler = Sampler(disk_paths=[])
        self.xid_counts = xid_counts

    def collect(self) -> Iterator[Any]:
        sample = self.sampler.sample(None)
        for name, help_text, value in HOST_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["host"])
            if (v := value(sample)) is not None:
                family.add_metric([HOST], float(v))
            yield family
        for name, help_text, value in GPU_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["host", "gpu"])
            for gpu in sample.gpus:
                if (v := value(gpu)) is not None:
                    family.add_metric([HOST, str(gpu.index)], float(v))
            yield family
        throttle = GaugeMetricFamily("trainguard_gpu_throttle_active", "1 while a clocks-event (throttle) reason is active",
                                     labels=["host", "gpu", "reason"])  # fmt: skip
        for gpu in sample.gpus:
            if gpu.throttle_reasons is not None:
                for bit, reason in THROTTLE_REASONS.items():
                    throttle.add_metric([HOST, str(gpu.index), reason], 1.0 if gpu.throttle_reasons & bit else 0.0)
        yield throttle
        if self.xid_counts is not None:
            xids = CounterMetricFamily("trainguard_gpu_xid_events", "NVIDIA Xid errors in the kernel log since boot, by code",
                                       labels=["host", "code"])  # fmt: skip
            for code, count in sorted(self.xid_counts().items()):
                xids.add_metric([HOST, str(code)], count)
            yield xids
        if self.registry is not None:
            yield from self._runs()

    def _runs(self) -> Iterator[Any]:
        labels = ["host", "run", "name"]
        info = GaugeMetricFamily(
            "trainguard_run_state_info", "1 for the run's current state", labels=[*labels, "state"]
        )
        attempts = CounterMetricFamily("trainguard_run_attempts", "Attempts started", labels=labels)
        deaths = CounterMetricFamily("trainguard_run_deaths", "Attempts that died, by cause", labels=[*labels, "cause"])
        age = GaugeMetricFamily(
            "trainguard_run_last_checkpoint_age_seconds", "Seconds since the newest checkpoint", labels=labels
        )
        interval = GaugeMetricFamily(
            "trainguard_run_checkpoint_interval_seconds",
            "Typical gap between the run's recent checkpoints (median), to judge the age against",
            labels=labels,
        )
        ended = GaugeMetricFamily(
            "trainguard_run_end_time_seconds",
            "When a run that ended did so (Unix time of its last attempt's end)",
            labels=labels,
        )
        ratio = GaugeMetricFamily(
            "trainguard_run_goodput_ratio",
            "Training kept / wall time, 0..1: what the run's deaths, restarts and redone steps left of its time",
            labels=labels,
        )
        wall = GaugeMetricFamily(
            "trainguard_run_wall_seconds", "The run's wall time (attempts and the restarts between them)", labels=labels
        )
        kept = GaugeMetricFamily(
            "trainguard_run_training_kept_seconds", "Training time no later attempt had to redo", labels=labels
        )
        lost = GaugeMetricFamily(
            "trainguard_run_lost_seconds",
            "Wall time lost to deaths: kind=recomputed (steps redone after resuming from an older checkpoint), "
            "restart (from a death to training again), stalled (from the last sign of progress to the death)",
            labels=[*labels, "kind"],
        )
        from trainguard import goodput
        from trainguard.checkpoint.resume import checkpoint_times
        from trainguard.store.states import PUBLIC_STATE, TERMINAL_STATES, RunState

        runs = [r for r in self.registry.all() if self.run_id in (None, r.id)]
        for run in runs:
            key = [run.host, run.id, run.name or ""]
            state = RunState(run.state)
            info.add_metric([*key, PUBLIC_STATE[state]], 1.0)
            attempts.add_metric(key, len(run.attempts))
            for cause, count in Counter(a.cause for a in run.attempts if a.cause).items():
                deaths.add_metric([*key, cause], count)
            if state in TERMINAL_STATES and run.attempts and run.attempts[-1].ended_at is not None:
                ended.add_metric(key, run.attempts[-1].ended_at)
            folder = run.options.get("checkpoint_dir")
            times = (
                checkpoint_times(folder, run.options.get("checkpoint_glob"),
                                 layout=run.options.get("checkpoint_layout", "auto"))
                if folder
                else []
            )  # fmt: skip
            if times:
                age.add_metric(key, max(0.0, time.time() - times[0]))
            if (gap := typical_gap(times)) is not None:
                interval.add_metric(key, gap)
            if run.attempts:
                result = goodput.of_run(run, self.registry.events(run.id, kinds=("checkpoint",)), now=time.time())
                if result.ratio is not None:  # None: nothing ran yet, or the job reports no steps nor checkpoints
                    ratio.add_metric(key, result.ratio)
                    kept.add_metric(key, result.kept_s)
                wall.add_metric(key, result.wall_s)
                for kind, seconds in result.lost_by_kind().items():
                    lost.add_metric([*key, kind], seconds)
        yield from (info, attempts, deaths, age, interval, ended, ratio, wall, kept, lost)


def typical_gap(times: list[float]) -> float | None:
    """The median gap between consecutive checkpoint times (any order); None with fewer than two.
    The median, so one long pause (a restart, a slow save) does not stretch the interval."""
    ordered = sorted(times)
    gaps = [later - earlier for earlier, later in itertools.pairwise(ordered)]
    return statistics.median(gaps) if gaps else None


def kernel_xid_counter() -> Callable[[], Counter]:
    def count() -> Counter:
        from trainguard.diagnosis.evidence import xid_lines
        from trainguard.probes import kernel_log

        try:
            lines, _ = kernel_log.read_live()
        except kernel_log.KernelLogUnavailable:
            return Counter()
        return Counter(code for code, _ in xid_lines(lines))

    return count


def serve(port: int, bind: str, collector: Collector) -> MetricsServer:
    """Serves the collector at http://BIND:PORT/metrics from a thread of its own until the process ends
    or the returned server's ``shutdown()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server = MetricsServer(bind, port, make_wsgi_app(registry))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {bind} is in use", f"{bind} 上的端口 {port} 已被占用") from exc
        raise UsageError(f"cannot serve metrics on {bind}:{port}: {exc.strerror}",
                         f"无法在 {bind}:{port} 上提供指标：{exc.strerror}") from exc  # fmt: skip
    threading.Thread(target=server.serve_forever, name="trainguard-metrics", daemon=True).start()
    return server
