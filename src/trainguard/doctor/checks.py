"""The doctor's checks: each a pure function of a Facts snapshot. "Could not look" is ``unknown``
with the reason, never ``ok``. Fix texts live in data/checks.toml."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import cache

from trainguard._resources import load_json, load_toml
from trainguard.doctor.facts import Facts, Gpu

GIB = 1024**3
MIB = 1024**2


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"


Text = dict[str, str]  # {"en": ..., "zh": ...}


def T(en: str, zh: str) -> Text:
    return {"en": en, "zh": zh}


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: Status
    summary: Text
    detail: Text
    fix: Text


@cache
def _fixes() -> dict[str, Text]:
    return {check_id: dict(texts) for check_id, texts in load_toml("checks.toml").items()}


def _result(check_id: str, status: Status, summary: Text, detail: Text | None = None) -> CheckResult:
    fix = _fixes()[check_id] if status in (Status.WARN, Status.FAIL) else T("", "")
    return CheckResult(check_id, status, summary, detail or T("", ""), fix)


def _unknown(check_id: str, facts: Facts, *keys: str) -> CheckResult:
    reason = next((facts.unknown[k] for k in keys if k in facts.unknown), T("not available", "无法获取"))
    if isinstance(reason, str):  # said by a library, in its own words
        reason = T(reason, f"「{reason}」")
    return _result(check_id, Status.UNKNOWN, T(f"could not look: {reason['en']}", f"无法检查：{reason['zh']}"))


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _cuda(version: tuple[int, int] | None) -> str:
    return "?" if version is None else f"{version[0]}.{version[1]}"


# ------------------------------------------------------------------------------------------ versions
@cache
def _cuda_table() -> list[dict]:
    return load_json("cuda_compat.json")["toolkits"]


def _driver_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def cuda_supported_by_driver(driver_version: str) -> tuple[int, int] | None:
    """The newest CUDA whose toolkit driver this driver meets (when NVML cannot say it directly)."""
    best = None
    for row in _cuda_table():
        if _driver_tuple(driver_version) >= _driver_tuple(row["toolkit_driver"]):
            best = tuple(int(x) for x in row["cuda"].split("."))
    return best  # type: ignore[return-value]


def check_driver_library(facts: Facts) -> CheckResult:
    cid = "driver_library_match"
    if facts.nvml_error and "mismatch" in facts.nvml_error.lower():
        return _result(cid, Status.FAIL, T("the NVIDIA kernel module and user-space library differ (driver upgraded, not reloaded)",
                                           "NVIDIA 内核模块与用户态库版本不一致（驱动已升级但未重新加载）"),
                       T(facts.nvml_error, facts.nvml_error))  # fmt: skip
    if facts.kernel_module_version and facts.nvml_library_version:
        if facts.kernel_module_version != facts.nvml_library_version:
            detail = f"kernel module {facts.kernel_module_version}, NVML library {facts.nvml_library_version}"
            return _result(cid, Status.FAIL, T("kernel module and NVML library versions differ", "内核模块与 NVML 库版本不同"),
                           T(detail, detail))  # fmt: skip
        v = facts.kernel_module_version
        return _result(cid, Status.OK, T(f"driver {v}: kernel module and library match", f"驱动 {v}：内核模块与库一致"))
    if facts.driver_version:
        v = facts.driver_version
        return _result(cid, Status.OK, T(f"driver {v}", f"驱动 {v}"))
    return _unknown(cid, facts, "driver_version", "gpus")


def check_driver_cuda_compat(facts: Facts) -> CheckResult:
    """The rule: CUDA supported by the driver >= toolkit (nvcc) >= the framework's CUDA build."""
    cid = "driver_cuda_compat"
    driver_cuda = facts.driver_cuda or (
        cuda_supported_by_driver(facts.driver_version) if facts.driver_version else None
    )
    if driver_cuda is None:
        return _unknown(cid, facts, "driver_version", "gpus")
    parts = [f"driver supports CUDA {_cuda(driver_cuda)}"]
    if facts.toolkit_cuda:
        parts.append(f"toolkit (nvcc) {_cuda(facts.toolkit_cuda)}")
    if facts.torch_cuda:
        parts.append(f"PyTorch {facts.torch_version} built for CUDA {_cuda(facts.torch_cuda)}")
    detail = T(", ".join(parts), "，".join(parts))
    torch_cuda = facts.torch_cuda
    if torch_cuda and torch_cuda > driver_cuda:
        if torch_cuda[0] > driver_cuda[0]:
            return _result(cid, Status.FAIL, T(f"the driver (CUDA {_cuda(driver_cuda)}) is too old for PyTorch's CUDA {_cuda(torch_cuda)}",
                                               f"驱动（CUDA {_cuda(driver_cuda)}）对 PyTorch 的 CUDA {_cuda(torch_cuda)} 来说太旧"), detail)  # fmt: skip
        return _result(cid, Status.WARN, T(f"PyTorch's CUDA {_cuda(torch_cuda)} is newer than the driver's {_cuda(driver_cuda)}: "
                                           "it runs only under minor-version compatibility (no PTX JIT of newer code)",
                                           f"PyTorch 的 CUDA {_cuda(torch_cuda)} 比驱动支持的 {_cuda(driver_cuda)} 新：只能在次版本兼容模式下运行"),
                       detail)  # fmt: skip
    if facts.toolkit_cuda and facts.toolkit_cuda > driver_cuda:
        return _result(cid, Status.WARN, T(f"nvcc {_cuda(facts.toolkit_cuda)} is newer than the driver's CUDA {_cuda(driver_cuda)}: "
                                           "extensions built with it may not load",
                                           f"nvcc {_cuda(facts.toolkit_cuda)} 比驱动支持的 CUDA {_cuda(driver_cuda)} 新：用它编译的扩展可能无法加载"),
                       detail)  # fmt: skip
    if facts.toolkit_cuda and torch_cuda and facts.toolkit_cuda[0] != torch_cuda[0]:
        return _result(cid, Status.WARN, T(f"nvcc {_cuda(facts.toolkit_cuda)} and PyTorch's CUDA {_cuda(torch_cuda)} differ in major version: "
                                           "CUDA extensions will refuse to build",
                                           f"nvcc {_cuda(facts.toolkit_cuda)} 与 PyTorch 的 CUDA {_cuda(torch_cuda)} 主版本不同：CUDA 扩展将无法编译"),
                       detail)  # fmt: skip
    return _result(
        cid, Status.OK, T("driver CUDA >= toolkit >= framework build", "驱动 CUDA >= 工具包 >= 框架编译版本"), detail
    )


def check_torch_gpu_arch(facts: Facts) -> CheckResult:
    cid = "torch_gpu_arch"
    if facts.torch_version is None:
        return _unknown(cid, facts, "torch_version")
    if facts.torch_cuda is None:
        if facts.gpus:
            return _result(cid, Status.FAIL, T(f"PyTorch {facts.torch_version} is a CPU-only build on a machine with GPUs",
                                               f"PyTorch {facts.torch_version} 是仅 CPU 版本，但机器上有 GPU"))  # fmt: skip
        return _result(
            cid,
            Status.OK,
            T(
                f"PyTorch {facts.torch_version} (CPU build), no GPU",
                f"PyTorch {facts.torch_version}（CPU 版本），无 GPU",
            ),
        )
    if facts.gpus is None:
        return _unknown(cid, facts, "gpus")
    missing = [gpu for gpu in facts.gpus if gpu.compute_capability and not _arch_supported(gpu, facts.torch_arch_list)]
    if missing:
        names = ", ".join(
            f"GPU {g.index} {g.name} (sm_{g.compute_capability[0]}{g.compute_capability[1]})" for g in missing
        )
        archs = " ".join(facts.torch_arch_list)
        return _result(cid, Status.FAIL, T(f"PyTorch has no kernels for {names}: 'no kernel image is available'",
                                           f"PyTorch 没有适用于 {names} 的内核：会出现 'no kernel image is available'"),
                       T(f"PyTorch's architectures: {archs}", f"PyTorch 支持的架构：{archs}"))  # fmt: skip
    return _result(cid, Status.OK, T("PyTorch has kernels for every GPU", "PyTorch 支持每一张 GPU 的架构"))


def _arch_supported(gpu: Gpu, arch_list: tuple[str, ...]) -> bool:
    major, minor = gpu.compute_capability  # type: ignore[misc]
    if f"sm_{major}{minor}" in arch_list:
        return True
    # Binary compatibility within a major version (sm_86 runs sm_80 code), and PTX JIT upwards.
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        if not number[:2].isdigit():
            continue
        a_major, a_minor = int(number[:-1]), int(number[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


# ------------------------------------------------------------------------------------------ limits
def check_container(facts: Facts) -> CheckResult:
    cid = "container"
    if facts.container is None:
        return _unknown(cid, facts, "container")
    if facts.container:
        return _result(cid, Status.OK, T(f"inside a {facts.container} container: limits below are the container's",
                                         f"运行在 {facts.container} 容器中：下面的限制来自容器"))  # fmt: skip
    return _result(cid, Status.OK, T("not in a container", "不在容器中"))


def check_shm_size(facts: Facts) -> CheckResult:
    cid = "shm_size"
    if facts.shm_total is None:
        return _unknown(cid, facts, "shm_total")
    size = _gib(facts.shm_total)
    free = _gib(facts.shm_free or 0)
    detail = T(f"/dev/shm: {size}, {free} free", f"/dev/shm：{size}，可用 {free}")
    if facts.shm_total < 256 * MIB:
        return _result(cid, Status.FAIL, T(f"/dev/shm is only {size}: DataLoader workers will die of SIGBUS",
                                           f"/dev/shm 只有 {size}：DataLoader worker 会因 SIGBUS 崩溃"), detail)  # fmt: skip
    if facts.shm_total < GIB:
        return _result(
            cid,
            Status.WARN,
            T(f"/dev/shm is {size}: small for DataLoader workers", f"/dev/shm 为 {size}：对 DataLoader worker 偏小"),
            detail,
        )
    return _result(cid, Status.OK, T(f"/dev/shm {size}", f"/dev/shm {size}"), detail)


def check_cgroup_memory_limit(facts: Facts) -> CheckResult:
    cid = "cgroup_memory_limit"
    if facts.host_memory is None:
        return _unknown(cid, facts, "host_memory")
    host = _gib(facts.host_memory)
    if facts.cgroup_memory_limit is None:
        return _result(
            cid, Status.OK, T(f"no memory cgroup limit; host RAM {host}", f"无 cgroup 内存上限；主机内存 {host}")
        )
    limit = _gib(facts.cgroup_memory_limit)
    detail = T(f"limit {limit} of {host} host RAM: the OOM killer acts at the limit",
               f"上限 {limit}（主机内存 {host}）：到达上限时 OOM killer 会杀进程")  # fmt: skip
    if facts.cgroup_memory_limit < min(8 * GIB, facts.host_memory // 2):
        return _result(cid, Status.WARN, T(f"memory limited to {limit} by a cgroup (host has {host})",
                                           f"cgroup 把内存限制为 {limit}（主机有 {host}）"), detail)  # fmt: skip
    return _result(cid, Status.OK, T(f"memory limited to {limit} by a cgroup (host has {host})",
                                     f"cgroup 把内存限制为 {limit}（主机有 {host}）"), detail)  # fmt: skip


def check_swap(facts: Facts) -> CheckResult:
    cid = "swap"
    if facts.swap_total is None:
        return _unknown(cid, facts, "swap_total")
    if facts.swap_total == 0:
        return _result(cid, Status.OK, T("no swap: when RAM is full the OOM killer acts at once",
                                         "无 swap：内存占满时 OOM killer 会立即动作"))  # fmt: skip
    return _result(cid, Status.OK, T(f"swap {_gib(facts.swap_total)}", f"swap {_gib(facts.swap_total)}"))


def check_open_files(facts: Facts) -> CheckResult:
    cid = "open_files_limit"
    if facts.nofile_soft is None:
        return _unknown(cid, facts, "nofile_soft")
    summary = T(
        f"ulimit -n {facts.nofile_soft} (hard {facts.nofile_hard})",
        f"ulimit -n {facts.nofile_soft}（硬上限 {facts.nofile_hard}）",
    )
    if facts.nofile_soft < 1024:
        return _result(cid, Status.FAIL, summary)
    if facts.nofile_soft < 4096:
        return _result(cid, Status.WARN, summary)
    return _result(cid, Status.OK, summary)


def check_disk_space(facts: Facts) -> CheckResult:
    cid = "disk_space"
    if not facts.disks:
        return _unknown(cid, facts, "disks")
    needed = max(GIB, 2 * (facts.last_checkpoint_bytes or 0))
    comfortable = max(10 * GIB, 5 * (facts.last_checkpoint_bytes or 0))
    worst = min(facts.disks, key=lambda d: d.free)
    lines = "; ".join(f"{d.path}: {_gib(d.free)} free of {_gib(d.total)}" for d in facts.disks)
    detail = T(lines, lines)
    if worst.free < needed:
        return _result(cid, Status.FAIL, T(f"{worst.path} has {_gib(worst.free)} free: the next checkpoint may not fit",
                                           f"{worst.path} 只剩 {_gib(worst.free)}：下一个检查点可能放不下"), detail)  # fmt: skip
    if worst.free < comfortable:
        return _result(
            cid,
            Status.WARN,
            T(f"{worst.path} has {_gib(worst.free)} free", f"{worst.path} 剩余 {_gib(worst.free)}"),
            detail,
        )
    return _result(
        cid,
        Status.OK,
        T(f"enough free disk ({_gib(worst.free)} at least)", f"磁盘空间充足（至少 {_gib(worst.free)}）"),
        detail,
    )


# A run's checkpoints go to the state folder (under the home directory by default) unless
# --checkpoint-dir: room for keep + 1 of them (Checkpointer's keep=3, the next written before the oldest
# goes), and never less than 20 GiB, which holds one checkpoint of a 7B model's bf16 weights (13 GiB)
# and little else; home quotas of 5-50 GB are common on shared clusters.
CHECKPOINTS_ON_DISK = 4
CHECKPOINT_ROOM_FLOOR = 20 * GIB


def check_checkpoint_disk_room(facts: Facts) -> CheckResult:
    cid = "checkpoint_disk_room"
    disk = facts.state_disk
    if facts.checkpoint_dir_chosen:
        return _result(cid, Status.OK, T(f"checkpoints go to {facts.checkpoint_dir_chosen}, not the state folder (see disk_space)",
                                         f"检查点写到 {facts.checkpoint_dir_chosen}，不在状态目录（见 disk_space）"))  # fmt: skip
    if disk is None:
        return _unknown(cid, facts, "state_disk")
    room, quota_en, quota_zh = disk.free, "", ""
    if disk.quota_limit is not None:
        used = disk.quota_used or 0
        room = min(room, max(0, disk.quota_limit - used))
        quota_en, quota_zh = (f"; your quota: {_gib(used)} of {_gib(disk.quota_limit)} used",
                              f"；你的配额：已用 {_gib(used)}，共 {_gib(disk.quota_limit)}")  # fmt: skip
    size = max(facts.state_checkpoint_bytes or 0, facts.last_checkpoint_bytes or 0)
    needed = max(CHECKPOINT_ROOM_FLOOR, CHECKPOINTS_ON_DISK * size)
    why_en = f"{CHECKPOINTS_ON_DISK} checkpoints of {_gib(size)}" if needed > CHECKPOINT_ROOM_FLOOR else "at least"
    why_zh = f"{CHECKPOINTS_ON_DISK} 个 {_gib(size)} 的检查点" if needed > CHECKPOINT_ROOM_FLOOR else "至少"
    detail = T(f"{disk.path}: {_gib(disk.free)} free of {_gib(disk.total)}{quota_en}; wanted: {why_en} {_gib(needed)}",
               f"{disk.path}：剩余 {_gib(disk.free)}，共 {_gib(disk.total)}{quota_zh}；需要：{why_zh} {_gib(needed)}")  # fmt: skip
    where_en, where_zh = (("the state folder in your home folder", "你的主目录中的状态目录") if disk.in_home
                          else (f"the state folder {disk.path}", f"状态目录 {disk.path}"))  # fmt: skip
    if room < needed:
        return _result(cid, Status.WARN, T(f"checkpoints go to {where_en} by default: only {_gib(room)} left for them there",
                                           f"检查点默认写到{where_zh}：那里只剩 {_gib(room)}"), detail)  # fmt: skip
    return _result(cid, Status.OK, T(f"{_gib(room)} free for checkpoints in the state folder",
                                     f"状态目录中有 {_gib(room)} 可用于检查点"), detail)  # fmt: skip


# ------------------------------------------------------------------------------------------ session
def check_ssh_session(facts: Facts) -> CheckResult:
    cid = "ssh_session"
    if facts.kill_user_processes and not facts.lingering:
        return _result(cid, Status.WARN, T("systemd kills all your processes at logout (KillUserProcesses=yes, no linger): even tmux dies",
                                           "systemd 会在退出登录时杀死你的所有进程（KillUserProcesses=yes 且未开启 linger）：连 tmux 也会被杀"))  # fmt: skip
    if facts.ssh and not facts.multiplexer and not facts.under_trainguard:
        return _result(cid, Status.WARN, T("this shell is an SSH session without tmux/screen: a job started here dies when the connection drops",
                                           "当前是未使用 tmux/screen 的 SSH 会话：在这里启动的作业会随连接断开而终止"))  # fmt: skip
    if facts.multiplexer or facts.under_trainguard:
        where = facts.multiplexer or "trainguard"
        return _result(cid, Status.OK, T(f"session: {where}", f"会话：{where}"))
    if facts.ssh:
        return _result(cid, Status.OK, T("session: SSH", "会话：SSH"))
    return _result(cid, Status.OK, T("session: a local session", "会话：本地会话"))


# ------------------------------------------------------------------------------------------ GPUs
# NVML clocks-event reasons (tools/reference/nvml_throttle.json): which ones mean trouble.
THERMAL_OR_HW = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake"}
POWER = {0x4: "SW power cap"}


def _gpu_check(cid: str, facts: Facts, judge: Callable[[Gpu], tuple[Status, str, str] | None], ok: Text) -> CheckResult:
    if facts.gpus is None:
        return _unknown(cid, facts, "gpus")
    if not facts.gpus:
        return _result(cid, Status.UNKNOWN, T("no NVIDIA GPU on this machine", "这台机器上没有 NVIDIA GPU"))
    findings = [(gpu, verdict) for gpu in facts.gpus if (verdict := judge(gpu)) is not None]
    if not findings:
        return _result(cid, Status.OK, ok)
    status = max((v[0] for _, v in findings), key=[Status.OK, Status.UNKNOWN, Status.WARN, Status.FAIL].index)
    en = "; ".join(f"GPU {gpu.index}: {v[1]}" for gpu, v in findings)
    zh = "；".join(f"GPU {gpu.index}：{v[2]}" for gpu, v in findings)
    return _result(cid, status, T(en, zh))


def check_gpu_temperature(facts: Facts) -> CheckResult:
    def judge(gpu: Gpu) -> tuple[Status, str, str] | None:
        if gpu.temperature_c is None:
            return Status.UNKNOWN, "temperature unreadable", "无法读取温度"
        limit = gpu.slowdown_temperature_c or 90
        if gpu.temperature_c >= limit:
            return (
                Status.FAIL,
                f"{gpu.temperature_c} °C, at its slowdown limit {limit} °C",
                f"{gpu.temperature_c} °C，已达降频温度 {limit} °C",
            )
        if gpu.temperature_c >= limit - 8:
            return (
                Status.WARN,
                f"{gpu.temperature_c} °C, near its slowdown limit {limit} °C",
                f"{gpu.temperature_c} °C，接近降频温度 {limit} °C",
            )
        return None

    return _gpu_check("gpu_temperature", facts, judge, T("temperatures normal", "温度正常"))


def check_gpu_throttle(facts: Facts) -> CheckResult:
    def judge(gpu: Gpu) -> tuple[Status, str, str] | None:
        if gpu.throttle_reasons is None:
            return Status.UNKNOWN, "throttle reasons unreadable", "无法读取降频原因"
        active = [name for bit, name in THERMAL_OR_HW.items() if gpu.throttle_reasons & bit]
        if active:
            return Status.WARN, "throttled: " + ", ".join(active), "正在降频：" + "、".join(active)
        return None

    return _gpu_check("gpu_throttle", facts, judge, T("no thermal or hardware throttling", "没有因温度或硬件降频"))


def check_gpu_ecc(facts: Facts) -> CheckResult:
    def judge(gpu: Gpu) -> tuple[Status, str, str] | None:
        if gpu.remapped_rows_failure:
            return Status.FAIL, "row remapping failed: the GPU needs service", "行重映射失败：GPU 需要维修"
        if gpu.ecc_uncorrected_volatile:
            n = gpu.ecc_uncorrected_volatile
            return (
                Status.FAIL,
                f"{n} uncorrectable ECC errors since the last reset",
                f"自上次重置以来有 {n} 个不可纠正的 ECC 错误",
            )
        if gpu.remapped_rows_pending or gpu.retired_pages_pending:
            return Status.WARN, "memory repair pending: reset the GPU", "显存修复待处理：需要重置 GPU"
        return None

    return _gpu_check("gpu_ecc", facts, judge, T("no uncorrectable memory errors", "没有不可纠正的显存错误"))


def check_gpu_pcie(facts: Facts) -> CheckResult:
    def judge(gpu: Gpu) -> tuple[Status, str, str] | None:
        if gpu.pcie_width is None or gpu.pcie_width_max is None:
            return None
        if gpu.pcie_width < gpu.pcie_width_max:
            return (Status.WARN, f"PCIe link x{gpu.pcie_width} of x{gpu.pcie_width_max} (seating or riser?)",
                    f"PCIe 链路 x{gpu.pcie_width}，最大 x{gpu.pcie_width_max}（插槽或转接卡问题？）")  # fmt: skip
        return None  # a lower generation at idle is power saving, not a fault

    return _gpu_check("gpu_pcie_link", facts, judge, T("PCIe links at full width", "PCIe 链路宽度正常"))


def check_gpu_persistence(facts: Facts) -> CheckResult:
    def judge(gpu: Gpu) -> tuple[Status, str, str] | None:
        if gpu.persistence_mode is False:
            return Status.WARN, "persistence mode off", "持久模式关闭"
        return None

    return _gpu_check("gpu_persistence_mode", facts, judge, T("persistence mode on", "持久模式开启"))


def check_gpu_processes(facts: Facts) -> CheckResult:
    def judge(gpu: Gpu) -> tuple[Status, str, str] | None:
        if gpu.processes:
            listed = ", ".join(
                f"{p.name}[{p.pid}] {_gib(p.used_bytes) if p.used_bytes else '?'}" for p in gpu.processes
            )
            return Status.WARN, f"memory held by {listed}", f"显存被占用：{listed}"
        return None

    return _gpu_check(
        "gpu_other_processes", facts, judge, T("no other process holds GPU memory", "没有其他进程占用显存")
    )


def check_gpu_xid_history(facts: Facts) -> CheckResult:
    cid = "gpu_xid_history"
    if facts.xids is None:
        return _unknown(cid, facts, "xids")
    if not facts.xids:
        return _result(cid, Status.OK, T("no Xid errors in the kernel log", "内核日志中没有 Xid 错误"))
    from trainguard.diagnosis.signatures import lookup_xid

    infos = [lookup_xid(event.xid) for event in facts.xids]
    hardware = [i for i in infos if i.cause == "gpu_hardware" and i.weight >= 0.8]
    codes = sorted({i.xid for i in infos})
    detail_en = "; ".join(f"Xid {i.xid}: {i.name} — {i.action}" for i in {i.xid: i for i in infos}.values())
    status = Status.FAIL if hardware else Status.WARN
    return _result(cid, status, T(f"Xid errors in the kernel log: {', '.join(map(str, codes))}",
                                  f"内核日志中有 Xid 错误：{', '.join(map(str, codes))}"),
                   T(detail_en, detail_en))  # fmt: skip


CHECKS: dict[str, Callable[[Facts], CheckResult]] = {
    "driver_library_match": check_driver_library,
    "driver_cuda_compat": check_driver_cuda_compat,
    "torch_gpu_arch": check_torch_gpu_arch,
    "container": check_container,
    "shm_size": check_shm_size,
    "cgroup_memory_limit": check_cgroup_memory_limit,
    "swap": check_swap,
    "open_files_limit": check_open_files,
    "disk_space": check_disk_space,
    "checkpoint_disk_room": check_checkpoint_disk_room,
    "ssh_session": check_ssh_session,
    "gpu_temperature": check_gpu_temperature,
    "gpu_throttle": check_gpu_throttle,
    "gpu_ecc": check_gpu_ecc,
    "gpu_pcie_link": check_gpu_pcie,
    "gpu_persistence_mode": check_gpu_persistence,
    "gpu_other_processes": check_gpu_processes,
    "gpu_xid_history": check_gpu_xid_history,
}


def run_checks(facts: Facts, only: list[str] | None = None) -> list[CheckResult]:
    return [CHECKS[check_id](facts) for check_id in (only or list(CHECKS))]
