"""Alert rules: pure functions over recent samples. A rule fires once per episode: again only after
its condition has cleared."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trainguard.monitor.sampler import Sample

GPU_MEMORY_NEAR_CAP = 0.95
HOST_MEMORY_LOW = 0.05  # fraction of RAM (or the cgroup limit) still available
HOST_MEMORY_HORIZON_S = 600  # warn when the trend reaches zero within this
TREND_MIN_SAMPLES = 5
TREND_MIN_SPAN_S = 30
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


def host_memory_runout_s(samples: Sequence[Sample]) -> float | None:
    """Seconds until available memory reaches zero on the least-squares trend, if it is falling."""
    points = [(s.time, s.mem_available) for s in samples if s.mem_available is not None]
    if len(points) < TREND_MIN_SAMPLES or points[-1][0] - points[0][0] < TREND_MIN_SPAN_S:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    slope = sum((t - mean_t) * (m - mean_m) for t, m in points) / var  # bytes per second
    if slope >= 0:
        return None
    return max(0.0, points[-1][1] / -slope)


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
            runout = host_memory_runout_s(samples)
            if runout is not None and runout <= HOST_MEMORY_HORIZON_S:
                found.append(Alert("host_memory_trend", "host", "warning",
                                   f"RAM falling: at this rate it runs out in {runout / 60:.0f} min ({_gib(now.mem_available)} left)",
                                   f"内存持续下降：按当前速度约 {runout / 60:.0f} 分钟后耗尽（剩余 {_gib(now.mem_available)}）"))  # fmt: skip
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
    """Remembers which alerts are active, so each fires once per episode."""

    active: set[tuple[str, str]] = field(default_factory=set)

    def update(self, current: Sequence[Alert]) -> list[Alert]:
        keys = {(a.rule, a.key) for a in current}
        new = [a for a in current if (a.rule, a.key) not in self.active]
        self.active = keys
        return new
