"""Alert rules: pure functions over recent samples. A rule fires once per episode: again only after
its condition has cleared."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from trainguard.monitor.forecast import HOST_MEMORY, JOB_MEMORY, Projection, TrendRules, project, readings_from_samples
from trainguard.monitor.sampler import Sample
from trainguard.units import format_size

GPU_MEMORY_NEAR_CAP = 0.95
HOST_MEMORY_LOW = 0.05  # fraction of RAM (or the cgroup limit) still available
HOST_MEMORY_HORIZON_S = 600  # warn when the trend reaches zero within this
# A warning ten minutes ahead stands on at least two minutes of steady fall (the lookahead is five
# times the history), never on the half-minute burst of a test suite.
HOST_MEMORY_TREND = TrendRules(window_s=HOST_MEMORY_HORIZON_S, min_span_s=60, min_samples=8)
# Whether the job's own memory grows steadily, however far off its own end is.
JOB_MEMORY_TREND = replace(HOST_MEMORY_TREND, lookahead=math.inf)
JOB_SHARE_OF_GROWTH = 0.5  # the job's memory growing at least this share of the fall: the job takes it
SHM_NEAR_FULL = 0.90
GPU_HOT_C = 85
THERMAL_OR_HW_THROTTLE = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW/HW thermal, HW power brake
GIB = 1024**3


@dataclass(frozen=True)
class Alert:
    rule: str
    key: str  # one episode per (rule, key): per GPU, per disk
    severity: str  # "warning" | "critical"
    en: str
    zh: str


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _host_memory_projection(samples: Sequence[Sample]) -> Projection | None:
    return project(HOST_MEMORY, readings_from_samples(samples).get(HOST_MEMORY, []), HOST_MEMORY_TREND)


def host_memory_runout_s(samples: Sequence[Sample]) -> float | None:
    """Seconds until available memory reaches zero on its steady trend; None without one."""
    projection = _host_memory_projection(samples)
    return projection.seconds_to_exhaustion if projection else None


def _whose_memory(samples: Sequence[Sample], host: Projection) -> tuple[str, str]:
    """Whether the job's own memory is what grows, so the alert points at the job or at the machine."""
    rss = samples[-1].job_rss
    if rss is None:
        return "the job's own memory was not measured", "未测到作业自身的内存"
    job = project(JOB_MEMORY, readings_from_samples(samples).get(JOB_MEMORY, []), JOB_MEMORY_TREND)
    if job is not None and job.rate_bytes_per_s >= JOB_SHARE_OF_GROWTH * host.rate_bytes_per_s:
        rate = format_size(job.rate_bytes_per_s)
        return (f"the job's own memory grows {rate}/s (now {_gib(rss)})",
                f"作业自身的内存每秒增长 {rate}（现为 {_gib(rss)}）")  # fmt: skip
    return (f"other processes take it: the job's own memory holds at {_gib(rss)}",
            f"是其他进程在占用：作业自身的内存保持在 {_gib(rss)}")  # fmt: skip


def evaluate(samples: Sequence[Sample], *, checkpoint_bytes: int | None = None) -> list[Alert]:
    """The conditions true at the newest sample."""
    if not samples:
        return []
    now = samples[-1]
    found: list[Alert] = []
    for gpu in now.gpus:
        if gpu.memory_total and gpu.memory_used / gpu.memory_total >= GPU_MEMORY_NEAR_CAP:
            pct = 100 * gpu.memory_used / gpu.memory_total
            found.append(Alert("gpu_memory_near_cap", f"gpu{gpu.index}", "warning",
                               f"GPU {gpu.index} memory at {pct:.0f}% of {_gib(gpu.memory_total)}: CUDA out of memory is near",
                               f"GPU {gpu.index} 显存已用 {pct:.0f}%（共 {_gib(gpu.memory_total)}）：接近显存不足"))  # fmt: skip
        hot = gpu.temperature_c is not None and gpu.temperature_c >= GPU_HOT_C
        throttled = gpu.throttle_reasons is not None and bool(gpu.throttle_reasons & THERMAL_OR_HW_THROTTLE)
        if hot or throttled:
            en = [f"at {gpu.temperature_c} °C"] * hot + ["throttled by heat or hardware"] * throttled
            zh = [f"温度 {gpu.temperature_c} °C"] * hot + ["因温度或硬件降频"] * throttled
            found.append(Alert("gpu_hot_or_throttled", f"gpu{gpu.index}", "warning",
                               f"GPU {gpu.index} " + " and ".join(en), f"GPU {gpu.index} " + "，".join(zh)))  # fmt: skip
    if now.mem_available is not None and now.mem_total:
        if now.mem_available / now.mem_total < HOST_MEMORY_LOW:
            found.append(Alert("host_memory_low", "host", "critical",
                               f"only {_gib(now.mem_available)} of {_gib(now.mem_total)} RAM left: the OOM killer is near",
                               f"内存只剩 {_gib(now.mem_available)}（共 {_gib(now.mem_total)}）：OOM killer 即将动作"))  # fmt: skip
        else:
            trend = _host_memory_projection(samples)
            if trend is not None and trend.seconds_to_exhaustion <= HOST_MEMORY_HORIZON_S:
                runout = trend.seconds_to_exhaustion
                whose_en, whose_zh = _whose_memory(samples, trend)
                found.append(Alert("host_memory_trend", "host", "warning",
                                   f"RAM falling: at this rate it runs out in {runout / 60:.0f} min ({_gib(now.mem_available)} left); {whose_en}",
                                   f"内存持续下降：按当前速度约 {runout / 60:.0f} 分钟后耗尽（剩余 {_gib(now.mem_available)}）；{whose_zh}"))  # fmt: skip
    if now.shm_used is not None and now.shm_total and now.shm_used / now.shm_total >= SHM_NEAR_FULL:
        found.append(Alert("shm_near_full", "shm", "warning",
                           f"/dev/shm {100 * now.shm_used / now.shm_total:.0f}% full ({_gib(now.shm_total)}): DataLoader workers may die of SIGBUS",
                           f"/dev/shm 已用 {100 * now.shm_used / now.shm_total:.0f}%（共 {_gib(now.shm_total)}）：DataLoader worker 可能因 SIGBUS 崩溃"))  # fmt: skip
    needed = max(GIB, int(1.5 * checkpoint_bytes)) if checkpoint_bytes else GIB
    for path, free in now.disk_free.items():
        if free < needed:
            found.append(Alert("disk_low", path, "critical",
                               f"{path} has {_gib(free)} free: the next checkpoint ({_gib(needed)}) may not fit",
                               f"{path} 只剩 {_gib(free)}：下一个检查点（{_gib(needed)}）可能放不下"))  # fmt: skip
    return found


@dataclass
class Episodes:
    """Remembers which alerts are active, so each fires once per episode; ``ended``: the episodes
    (rule, key) that the last update saw end."""

    active: set[tuple[str, str]] = field(default_factory=set)
    ended: list[tuple[str, str]] = field(default_factory=list)

    def update(self, current: Sequence[Alert]) -> list[Alert]:
        keys = {(a.rule, a.key) for a in current}
        new = [a for a in current if (a.rule, a.key) not in self.active]
        self.ended = sorted(self.active - keys)
        self.active = keys
        return new
