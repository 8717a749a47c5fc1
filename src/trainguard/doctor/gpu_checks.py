"""The doctor's GPU checks, each a pure function of a Facts snapshot: whether the driver, the CUDA
toolkit and PyTorch's build agree and have kernels for every card, and each card's health
(temperature, throttling, ECC, PCIe link, persistence mode, other processes, Xid errors)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

from trainguard._resources import load_json
from trainguard.doctor.facts import Facts, Gpu
from trainguard.doctor.results import CheckResult, Status, T, Text, check_result, could_not_look, size_text


# ------------------------------------------------------------------------------------------ versions
def _cuda(version: tuple[int, int] | None) -> str:
    return "?" if version is None else f"{version[0]}.{version[1]}"


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
        return check_result(cid, Status.FAIL, T("the NVIDIA kernel module and user-space library differ (driver upgraded, not reloaded)",
                                                "NVIDIA 内核模块与用户态库版本不一致（驱动已升级但未重新加载）"),
                            T(facts.nvml_error, facts.nvml_error))  # fmt: skip
    if facts.kernel_module_version and facts.nvml_library_version:
        if facts.kernel_module_version != facts.nvml_library_version:
            detail = f"kernel module {facts.kernel_module_version}, NVML library {facts.nvml_library_version}"
            return check_result(cid, Status.FAIL, T("kernel module and NVML library versions differ", "内核模块与 NVML 库版本不同"),
                                T(detail, detail))  # fmt: skip
        v = facts.kernel_module_version
        return check_result(
            cid, Status.OK, T(f"driver {v}: kernel module and library match", f"驱动 {v}：内核模块与库一致")
        )
    if facts.driver_version:
        v = facts.driver_version
        return check_result(cid, Status.OK, T(f"driver {v}", f"驱动 {v}"))
    return could_not_look(cid, facts, "driver_version", "gpus")


def check_driver_cuda_compat(facts: Facts) -> CheckResult:
    """The rule: CUDA supported by the driver >= toolkit (nvcc) >= the framework's CUDA build."""
    cid = "driver_cuda_compat"
    driver_cuda = facts.driver_cuda or (
        cuda_supported_by_driver(facts.driver_version) if facts.driver_version else None
    )
    if driver_cuda is None:
        return could_not_look(cid, facts, "driver_version", "gpus")
    parts = [f"driver supports CUDA {_cuda(driver_cuda)}"]
    if facts.toolkit_cuda:
        parts.append(f"toolkit (nvcc) {_cuda(facts.toolkit_cuda)}")
    if facts.torch_cuda:
        parts.append(f"PyTorch {facts.torch_version} built for CUDA {_cuda(facts.torch_cuda)}")
    detail = T(", ".join(parts), "，".join(parts))
    torch_cuda = facts.torch_cuda
    if torch_cuda and torch_cuda > driver_cuda:
        if torch_cuda[0] > driver_cuda[0]:
            return check_result(cid, Status.FAIL, T(f"the driver (CUDA {_cuda(driver_cuda)}) is too old for PyTorch's CUDA {_cuda(torch_cuda)}",
                                                    f"驱动（CUDA {_cuda(driver_cuda)}）对 PyTorch 的 CUDA {_cuda(torch_cuda)} 来说太旧"), detail)  # fmt: skip
        return check_result(cid, Status.WARN, T(f"PyTorch's CUDA {_cuda(torch_cuda)} is newer than the driver's {_cuda(driver_cuda)}: "
                                                "it runs only under minor-version compatibility (no PTX JIT of newer code)",
                                                f"PyTorch 的 CUDA {_cuda(torch_cuda)} 比驱动支持的 {_cuda(driver_cuda)} 新：只能在次版本兼容模式下运行"),
                            detail)  # fmt: skip
    if facts.toolkit_cuda and facts.toolkit_cuda > driver_cuda:
        return check_result(cid, Status.WARN, T(f"nvcc {_cuda(facts.toolkit_cuda)} is newer than the driver's CUDA {_cuda(driver_cuda)}: "
                                                "extensions built with it may not load",
                                                f"nvcc {_cuda(facts.toolkit_cuda)} 比驱动支持的 CUDA {_cuda(driver_cuda)} 新：用它编译的扩展可能无法加载"),
                            detail)  # fmt: skip
    if facts.toolkit_cuda and torch_cuda and facts.toolkit_cuda[0] != torch_cuda[0]:
        return check_result(cid, Status.WARN, T(f"nvcc {_cuda(facts.toolkit_cuda)} and PyTorch's CUDA {_cuda(torch_cuda)} differ in major version: "
                                                "CUDA extensions will refuse to build",
                                                f"nvcc {_cuda(facts.toolkit_cuda)} 与 PyTorch 的 CUDA {_cuda(torch_cuda)} 主版本不同：CUDA 扩展将无法编译"),
                            detail)  # fmt: skip
    return check_result(
        cid, Status.OK, T("driver CUDA >= toolkit >= framework build", "驱动 CUDA >= 工具包 >= 框架编译版本"), detail
    )


def check_torch_gpu_arch(facts: Facts) -> CheckResult:
    cid = "torch_gpu_arch"
    if facts.torch_version is None:
        return could_not_look(cid, facts, "torch_version")
    if facts.torch_cuda is None:
        if facts.gpus:
            return check_result(cid, Status.FAIL, T(f"PyTorch {facts.torch_version} is a CPU-only build on a machine with GPUs",
                                                    f"PyTorch {facts.torch_version} 是仅 CPU 版本，但机器上有 GPU"))  # fmt: skip
        return check_result(
            cid,
            Status.OK,
            T(
                f"PyTorch {facts.torch_version} (CPU build), no GPU",
                f"PyTorch {facts.torch_version}（CPU 版本），无 GPU",
            ),
        )
    if facts.gpus is None:
        return could_not_look(cid, facts, "gpus")
    missing = [gpu for gpu in facts.gpus if gpu.compute_capability and not _arch_supported(gpu, facts.torch_arch_list)]
    if missing:
        names = ", ".join(
            f"GPU {g.index} {g.name} (sm_{g.compute_capability[0]}{g.compute_capability[1]})" for g in missing
        )
        archs = " ".join(facts.torch_arch_list)
        return check_result(cid, Status.FAIL, T(f"PyTorch has no kernels for {names}: 'no kernel image is available'",
                                                f"PyTorch 没有适用于 {names} 的内核：会出现 'no kernel image is available'"),
                            T(f"PyTorch's architectures: {archs}", f"PyTorch 支持的架构：{archs}"))  # fmt: skip
    return check_result(cid, Status.OK, T("PyTorch has kernels for every GPU", "PyTorch 支持每一张 GPU 的架构"))


_ARCH = re.compile(r"^(sm|compute)_([0-9]+)([0-9])([af]?)$")


def _arch_supported(gpu: Gpu, arch_list: tuple[str, ...]) -> bool:
    major, minor = gpu.compute_capability  # type: ignore[misc]
    for arch in arch_list:
        found = _ARCH.match(arch)
        if found is None:
            continue
        kind, a_major, a_minor, variant = found.group(1), int(found.group(2)), int(found.group(3)), found.group(4)
        if (a_major, a_minor) == (major, minor):
            return True
        if variant:  # sm_90a, sm_100f: features of that one architecture (family), never run elsewhere
            continue
        # Binary compatibility within a major version (sm_86 runs sm_80 code), and PTX JIT upwards.
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


# ------------------------------------------------------------------------------------------ health
# NVML clocks-event reasons (tools/reference/nvml_throttle.json): which ones mean trouble.
THERMAL_OR_HW = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake"}
POWER = {0x4: "SW power cap"}


def _gpu_check(cid: str, facts: Facts, judge: Callable[[Gpu], tuple[Status, str, str] | None], ok: Text) -> CheckResult:
    if facts.gpus is None:
        return could_not_look(cid, facts, "gpus")
    if not facts.gpus:
        return check_result(cid, Status.UNKNOWN, T("no NVIDIA GPU on this machine", "这台机器上没有 NVIDIA GPU"))
    findings = [(gpu, verdict) for gpu in facts.gpus if (verdict := judge(gpu)) is not None]
    if not findings:
        return check_result(cid, Status.OK, ok)
    status = max((v[0] for _, v in findings), key=[Status.OK, Status.UNKNOWN, Status.WARN, Status.FAIL].index)
    en = "; ".join(f"GPU {gpu.index}: {v[1]}" for gpu, v in findings)
    zh = "；".join(f"GPU {gpu.index}：{v[2]}" for gpu, v in findings)
    return check_result(cid, status, T(en, zh))


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
                f"{p.name}[{p.pid}] {size_text(p.used_bytes) if p.used_bytes else '?'}" for p in gpu.processes
            )
            return Status.WARN, f"memory held by {listed}", f"显存被占用：{listed}"
        return None

    return _gpu_check(
        "gpu_other_processes", facts, judge, T("no other process holds GPU memory", "没有其他进程占用显存")
    )


def check_gpu_xid_history(facts: Facts) -> CheckResult:
    cid = "gpu_xid_history"
    if facts.xids is None:
        return could_not_look(cid, facts, "xids")
    if not facts.xids:
        return check_result(cid, Status.OK, T("no Xid errors in the kernel log", "内核日志中没有 Xid 错误"))
    from trainguard.diagnosis.signatures import lookup_xid

    infos = [lookup_xid(event.xid) for event in facts.xids]
    hardware = [i for i in infos if i.cause == "gpu_hardware" and i.weight >= 0.8]
    codes = sorted({i.xid for i in infos})
    detail_en = "; ".join(f"Xid {i.xid}: {i.name} — {i.action}" for i in {i.xid: i for i in infos}.values())
    status = Status.FAIL if hardware else Status.WARN
    return check_result(cid, status, T(f"Xid errors in the kernel log: {', '.join(map(str, codes))}",
                                       f"内核日志中有 Xid 错误：{', '.join(map(str, codes))}"),
                        T(detail_en, detail_en))  # fmt: skip
