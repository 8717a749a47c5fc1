"""The snapshot of a machine that ``trainguard doctor`` judges: plain values that probes fill. A value
the probes could not read is None, with the reason in ``unknown`` under the same name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_bytes: int | None


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int] | None = None
    memory_total: int | None = None  # bytes
    memory_used: int | None = None  # bytes
    temperature_c: int | None = None
    slowdown_temperature_c: int | None = None
    throttle_reasons: int | None = None  # NVML clocks-event reason bitmask
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    persistence_mode: bool | None = None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class Disk:
    path: str
    free: int
    total: int


@dataclass(frozen=True)
class StateDisk:
    """The filesystem of the state folder, where a run's checkpoints go unless --checkpoint-dir."""

    path: str
    in_home: bool  # the state folder is under the home directory
    free: int  # bytes this user may still write there (statvfs)
    total: int
    quota_limit: int | None = None  # this user's block quota there, where the kernel keeps one
    quota_used: int | None = None


@dataclass(frozen=True)
class XidEvent:
    xid: int
    text: str


@dataclass(frozen=True)
class Facts:
    # NVIDIA stack
    driver_version: str | None = None  # e.g. "550.54.14"
    driver_cuda: tuple[int, int] | None = None  # the newest CUDA the driver supports
    nvml_error: str | None = None  # why NVML could not start, as NVML says it
    kernel_module_version: str | None = None  # /proc/driver/nvidia/version
    nvml_library_version: str | None = None
    toolkit_cuda: tuple[int, int] | None = None  # nvcc --version
    torch_version: str | None = None
    torch_cuda: tuple[int, int] | None = None  # torch.version.cuda (None: a CPU build)
    torch_arch_list: tuple[str, ...] = ()
    gpus: tuple[Gpu, ...] | None = None
    # container and limits
    container: str | None = None  # "docker", "podman", "kubernetes", "lxc", "" for none
    shm_total: int | None = None
    shm_free: int | None = None
    host_memory: int | None = None
    cgroup_memory_limit: int | None = None  # None: no limit
    swap_total: int | None = None
    nofile_soft: int | None = None
    nofile_hard: int | None = None
    disks: tuple[Disk, ...] = ()
    last_checkpoint_bytes: int | None = None
    checkpoint_dir_chosen: str | None = None  # --checkpoint-dir or TRAINGUARD_CHECKPOINT_DIR, outside the state folder
    state_disk: StateDisk | None = None
    state_checkpoint_bytes: int | None = None  # the largest newest checkpoint of the state folder's runs
    # session
    ssh: bool = False
    multiplexer: str | None = None  # "tmux", "screen"
    under_trainguard: bool = False
    kill_user_processes: bool | None = None
    lingering: bool | None = None
    # kernel log
    xids: tuple[XidEvent, ...] | None = None
    kernel_log_readable: bool | None = None
    oom_counter: str | None = None  # the OOM counter a user without the kernel log still reads
    # why a value is None, in both languages ({"en", "zh"}), or as a library said it (a str):
    # {"gpus": {"en": "no NVIDIA driver ...", "zh": "没有 NVIDIA 驱动 ..."}, ...}
    unknown: dict[str, Any] = field(default_factory=dict)
