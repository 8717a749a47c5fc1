"""Filling the doctor's Facts from the machine: NVML, /proc, nvcc, the installed torch, statvfs,
rlimits, the environment and the kernel log. Every probe returns a value or a reason; none raises."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainguard.checkpoint.layouts import newest_complete
from trainguard.diagnosis.evidence import xid_lines
from trainguard.doctor.checks import T, Text
from trainguard.doctor.facts import Disk, Facts, Gpu, GpuProcess, StateDisk, XidEvent
from trainguard.probes import kernel_log, oom_counters
from trainguard.probes.disk_quota import user_quota
from trainguard.probes.memory import cgroup_limit, meminfo_available

_RUNS_MEASURED = 20  # the newest run folders whose checkpoints tell the size of the next ones

_TORCH_PROBE = """
import json, torch
info = {"version": torch.__version__, "cuda": torch.version.cuda, "arch": []}
try:
    info["arch"] = torch._C._cuda_getArchFlags().split() if torch.version.cuda else []
except Exception:
    info["arch"] = []
print(json.dumps(info))
"""


def _nvidia(facts: dict[str, Any], unknown: dict[str, Text]) -> None:
    try:
        import pynvml
    except ImportError:
        unknown["gpus"] = unknown["driver_version"] = T("nvidia-ml-py is not installed", "未安装 nvidia-ml-py")
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        message = str(exc)
        if "mismatch" in message.lower():
            facts["nvml_error"] = "Failed to initialize NVML: Driver/library version mismatch"
        reason = (
            T("no NVIDIA driver (libnvidia-ml not found): no GPU on this machine?",
              "没有 NVIDIA 驱动（找不到 libnvidia-ml）：这台机器没有 GPU？")
            if "NotFound" in type(exc).__name__ or "not found" in message.lower()
            else T(f"NVML: {message}", f"NVML 报错：「{message}」")
        )  # fmt: skip
        unknown["gpus"] = unknown["driver_version"] = reason
        return
    try:
        facts["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        with contextlib.suppress(pynvml.NVMLError):
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            facts["driver_cuda"] = (cuda // 1000, (cuda % 1000) // 10)
        with contextlib.suppress(pynvml.NVMLError):
            facts["nvml_library_version"] = _text(pynvml.nvmlSystemGetNVMLVersion()).split(".", 1)[-1]
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            gpus.append(_gpu(pynvml, index))
        facts["gpus"] = tuple(gpus)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _gpu(pynvml: Any, index: int) -> Gpu:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)

    def get(function: str, *args: Any) -> Any:
        try:
            return getattr(pynvml, function)(h, *args)
        except (pynvml.NVMLError, AttributeError):
            return None

    memory = get("nvmlDeviceGetMemoryInfo")
    remap = get("nvmlDeviceGetRemappedRows")  # (corrected, uncorrected, pending, failure)
    processes = tuple(
        GpuProcess(p.pid, _process_name(p.pid), getattr(p, "usedGpuMemory", None))
        for p in (get("nvmlDeviceGetComputeRunningProcesses") or ())
        if p.pid != os.getpid()
    )
    ecc = get("nvmlDeviceGetTotalEccErrors", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
    pending_pages = get("nvmlDeviceGetRetiredPagesPendingStatus")
    return Gpu(
        index=index,
        name=_text(get("nvmlDeviceGetName") or "?"),
        compute_capability=get("nvmlDeviceGetCudaComputeCapability"),
        memory_total=memory.total if memory else None,
        memory_used=memory.used if memory else None,
        temperature_c=get("nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU),
        slowdown_temperature_c=get("nvmlDeviceGetTemperatureThreshold", pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        throttle_reasons=get("nvmlDeviceGetCurrentClocksEventReasons")
        or get("nvmlDeviceGetCurrentClocksThrottleReasons"),
        ecc_uncorrected_volatile=ecc,
        retired_pages_pending=None if pending_pages is None else bool(pending_pages),
        remapped_rows_pending=None if remap is None else bool(remap[2]),
        remapped_rows_failure=None if remap is None else bool(remap[3]),
        pcie_gen=get("nvmlDeviceGetCurrPcieLinkGeneration"),
        pcie_gen_max=get("nvmlDeviceGetMaxPcieLinkGeneration"),
        pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth"),
        pcie_width_max=get("nvmlDeviceGetMaxPcieLinkWidth"),
        persistence_mode=None if (mode := get("nvmlDeviceGetPersistenceMode")) is None else bool(mode),
        processes=processes,
    )


def _process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _kernel_module(facts: dict[str, Any], unknown: dict[str, Text]) -> None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return
    if match := re.search(r"Kernel Module(?: for [^ ]+)?\s+([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text):
        facts["kernel_module_version"] = match.group(1)
        facts.setdefault("driver_version", match.group(1))
        unknown.pop("driver_version", None)


def _nvcc(facts: dict[str, Any], unknown: dict[str, Text]) -> None:
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)
    if nvcc is None:
        unknown["toolkit_cuda"] = T("nvcc not found (no CUDA toolkit; only needed to build extensions)",
                                    "找不到 nvcc（没有 CUDA toolkit；只有编译扩展时才需要）")  # fmt: skip
        return
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20, check=False).stdout
        if match := re.search(r"release ([0-9]+)\.([0-9]+)", out):
            facts["toolkit_cuda"] = (int(match.group(1)), int(match.group(2)))
            return
    unknown["toolkit_cuda"] = T("nvcc --version gave no release", "nvcc --version 没有给出版本号")


def _torch(facts: dict[str, Any], unknown: dict[str, Text], python: str) -> None:
    # In a child process: a broken CUDA install can crash the interpreter on import.
    try:
        done = subprocess.run([python, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        unknown["torch_version"] = T(f"could not run {python}: {exc}", f"无法运行 {python}：「{exc}」")
        return
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        unknown["torch_version"] = (
            T("torch is not installed", "未安装 torch")
            if "No module named 'torch'" in last
            else T(f"import torch failed: {last}", f"import torch 失败：「{last}」")
        )
        return
    info = json.loads(done.stdout.strip().splitlines()[-1])
    facts["torch_version"] = info["version"]
    if info["cuda"]:
        major, minor = info["cuda"].split(".")[:2]
        facts["torch_cuda"] = (int(major), int(minor))
    facts["torch_arch_list"] = tuple(info["arch"])


def _container() -> str:
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    with contextlib.suppress(OSError):
        text = Path("/proc/1/cgroup").read_text()
        for marker, kind in (
            ("kubepods", "kubernetes"),
            ("docker", "docker"),
            ("lxc", "lxc"),
            ("containerd", "containerd"),
        ):
            if marker in text:
                return kind
    return ""


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _state_disk(state_dir: Path, facts: dict[str, Any], unknown: dict[str, Text]) -> None:
    """The state folder's filesystem (where checkpoints go by default) and the largest checkpoint its
    newest runs keep there."""
    try:
        usage = os.statvfs(_existing(state_dir))
    except OSError as exc:
        unknown["state_disk"] = T(f"cannot read {state_dir}: {exc.strerror}", f"无法读取 {state_dir}：{exc.strerror}")
        return
    quota = user_quota(_existing(state_dir))
    in_home = Path(os.path.realpath(state_dir)).is_relative_to(os.path.realpath(Path.home()))
    facts["state_disk"] = StateDisk(str(state_dir), in_home, usage.f_bavail * usage.f_frsize,
                                    usage.f_blocks * usage.f_frsize, quota.limit if quota else None,
                                    quota.used if quota else None)  # fmt: skip
    with contextlib.suppress(OSError):
        runs = sorted(os.scandir(state_dir / "runs"), key=lambda e: e.stat().st_mtime, reverse=True)
        sizes = []
        for entry in runs[:_RUNS_MEASURED]:
            with contextlib.suppress(Exception):
                newest = newest_complete(Path(entry.path) / "checkpoints")
                sizes.append(newest.size_bytes if newest else 0)
        facts["state_checkpoint_bytes"] = max(sizes, default=None)


def _systemd_session(user: str) -> tuple[bool | None, bool | None]:
    kill = None
    for conf in [Path("/etc/systemd/logind.conf"), *sorted(Path("/etc/systemd/logind.conf.d").glob("*.conf"))]:
        with contextlib.suppress(OSError):
            for line in conf.read_text().splitlines():
                if line.strip().startswith("KillUserProcesses="):
                    kill = line.split("=", 1)[1].strip().lower() in ("yes", "true", "1")
    lingering = Path(f"/var/lib/systemd/linger/{user}").exists() if kill else None
    return kill, lingering


def gather(
    *, checkpoint_dir: str | None, state_dir: Path, kernel_log_file: str | None, python: str = sys.executable
) -> Facts:
    facts: dict[str, Any] = {}
    unknown: dict[str, Text] = {}
    _nvidia(facts, unknown)
    _kernel_module(facts, unknown)
    _nvcc(facts, unknown)
    _torch(facts, unknown, python)
    facts["container"] = _container()

    with contextlib.suppress(OSError):
        shm = os.statvfs("/dev/shm")
        facts["shm_total"], facts["shm_free"] = shm.f_blocks * shm.f_frsize, shm.f_bavail * shm.f_frsize
    if "shm_total" not in facts:
        unknown["shm_total"] = T("/dev/shm is not mounted", "/dev/shm 没有挂载")
    with contextlib.suppress(OSError):
        meminfo = Path("/proc/meminfo").read_text()
        total = re.search(r"^MemTotal:\s+([0-9]+) kB", meminfo, re.MULTILINE)
        swap = re.search(r"^SwapTotal:\s+([0-9]+) kB", meminfo, re.MULTILINE)
        facts["host_memory"] = int(total.group(1)) * 1024 if total else meminfo_available(meminfo)
        facts["swap_total"] = int(swap.group(1)) * 1024 if swap else None
    with contextlib.suppress(OSError):
        facts["cgroup_memory_limit"] = cgroup_limit(Path("/proc/self/cgroup").read_text())
    facts["nofile_soft"], facts["nofile_hard"] = resource.getrlimit(resource.RLIMIT_NOFILE)

    folder = Path(checkpoint_dir or os.environ.get("TRAINGUARD_CHECKPOINT_DIR") or os.getcwd())
    disks = []
    for path in dict.fromkeys([folder, state_dir]):
        with contextlib.suppress(OSError):
            usage = shutil.disk_usage(_existing(path))
            disks.append(Disk(str(path), usage.free, usage.total))
    facts["disks"] = tuple(disks)
    with contextlib.suppress(Exception):
        newest = newest_complete(folder)
        if newest:
            facts["last_checkpoint_bytes"] = newest.size_bytes

    chosen = checkpoint_dir or os.environ.get("TRAINGUARD_CHECKPOINT_DIR")
    if chosen and not Path(os.path.realpath(chosen)).is_relative_to(os.path.realpath(state_dir)):
        facts["checkpoint_dir_chosen"] = chosen
    _state_disk(state_dir, facts, unknown)

    facts["ssh"] = bool(os.environ.get("SSH_CONNECTION") or os.environ.get("SSH_TTY"))
    facts["multiplexer"] = "tmux" if os.environ.get("TMUX") else ("screen" if os.environ.get("STY") else None)
    facts["under_trainguard"] = bool(os.environ.get("TRAINGUARD_RUN_ID"))
    with contextlib.suppress(KeyError):
        facts["kill_user_processes"], facts["lingering"] = _systemd_session(pwd.getpwuid(os.getuid()).pw_name)

    try:
        if kernel_log_file:
            lines = kernel_log.read_saved(kernel_log_file)
        else:
            lines, _ = kernel_log.read_live()
        facts["xids"] = tuple(XidEvent(code, line.text) for code, line in xid_lines(lines))
        facts["kernel_log_readable"] = True
    except kernel_log.KernelLogUnavailable as exc:
        unknown["xids"] = T(exc.message_en, exc.message_zh)
        facts["kernel_log_readable"] = False
    except OSError as exc:
        unknown["xids"] = T(f"cannot read {kernel_log_file}: {exc.strerror}", f"无法读取 {kernel_log_file}：{exc.strerror}")
    counts = oom_counters.read()
    facts["oom_counter"] = counts.cgroup_path or ("/proc/vmstat" if counts.system is not None else None)
    return Facts(**facts, unknown=unknown)
