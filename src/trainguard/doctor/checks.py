"""The doctor's checks, in the order it runs and reports them: each a pure function of a Facts
snapshot (the GPU checks in gpu_checks, those of the host in host_checks), run here by id.
"Could not look" is ``unknown`` with the reason, never ``ok``."""

from __future__ import annotations

from collections.abc import Callable

from trainguard.doctor.facts import Facts
from trainguard.doctor.gpu_checks import (
    check_driver_cuda_compat,
    check_driver_library,
    check_gpu_ecc,
    check_gpu_pcie,
    check_gpu_persistence,
    check_gpu_processes,
    check_gpu_temperature,
    check_gpu_throttle,
    check_gpu_xid_history,
    check_torch_gpu_arch,
    cuda_supported_by_driver,
)
from trainguard.doctor.host_checks import (
    check_cgroup_memory_limit,
    check_checkpoint_disk_room,
    check_container,
    check_disk_space,
    check_kernel_log_access,
    check_open_files,
    check_shm_size,
    check_ssh_session,
    check_swap,
)
from trainguard.doctor.results import GIB, MIB, CheckResult, Status, T, Text

# The results' vocabulary stays importable from here, where the doctor's callers have always found it.
__all__ = ["CHECKS", "GIB", "MIB", "CheckResult", "Status", "T", "Text", "cuda_supported_by_driver", "run_checks"]

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
    "kernel_log_access": check_kernel_log_access,
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
