"""The doctor's checks on recorded machine snapshots: pure functions, no machine needed."""

from __future__ import annotations

from dataclasses import replace

from trainguard.doctor.checks import GIB, MIB, Status, cuda_supported_by_driver, run_checks
from trainguard.doctor.facts import Disk, Facts, Gpu, GpuProcess, StateDisk, XidEvent

# An 8-GPU H100 node as NVML and the probes report it (driver 535.104.05 supports CUDA 12.2).
H100 = Gpu(index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), memory_total=80 * GIB, memory_used=0,
           temperature_c=34, slowdown_temperature_c=87, throttle_reasons=0x1, ecc_uncorrected_volatile=0,
           retired_pages_pending=False, remapped_rows_pending=False, remapped_rows_failure=False, pcie_gen=5,
           pcie_gen_max=5, pcie_width=16, pcie_width_max=16, persistence_mode=True)  # fmt: skip
HEALTHY = Facts(
    driver_version="535.104.05", driver_cuda=(12, 2), kernel_module_version="535.104.05",
    nvml_library_version="535.104.05", toolkit_cuda=(12, 1), torch_version="2.3.1+cu121", torch_cuda=(12, 1),
    torch_arch_list=("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"), gpus=(H100,),
    container="docker", shm_total=16 * GIB, shm_free=16 * GIB, host_memory=2000 * GIB, cgroup_memory_limit=None,
    swap_total=0, nofile_soft=1048576, nofile_hard=1048576, disks=(Disk("/data/ckpt", 2000 * GIB, 4000 * GIB),),
    last_checkpoint_bytes=20 * GIB, ssh=True, multiplexer="tmux", xids=(), kernel_log_readable=True,
    state_disk=StateDisk("/home/u/.local/state/trainguard", True, 500 * GIB, 1000 * GIB),
)  # fmt: skip


def by_id(facts: Facts) -> dict:
    return {r.id: r for r in run_checks(facts)}


def test_a_healthy_gpu_node_is_all_ok() -> None:
    results = by_id(HEALTHY)
    assert {i: r.status for i, r in results.items() if r.status is not Status.OK} == {}


def test_the_version_rule_driver_toolkit_framework() -> None:
    newer_torch = replace(HEALTHY, torch_cuda=(12, 4), torch_version="2.5.1+cu124")
    assert by_id(newer_torch)["driver_cuda_compat"].status is Status.WARN  # minor-version compatibility only
    old_driver = replace(HEALTHY, driver_version="470.57.02", driver_cuda=(11, 4))
    result = by_id(old_driver)["driver_cuda_compat"]
    assert result.status is Status.FAIL and "too old" in result.summary["en"]
    assert result.fix["zh"] and result.fix["en"]
    mismatched_nvcc = replace(HEALTHY, toolkit_cuda=(11, 8))
    assert by_id(mismatched_nvcc)["driver_cuda_compat"].status is Status.WARN


def test_driver_cuda_from_the_table_when_nvml_cannot_say() -> None:
    assert cuda_supported_by_driver("535.104.05") == (12, 2)
    assert cuda_supported_by_driver("470.57.02") == (11, 4)
    no_nvml = replace(HEALTHY, driver_cuda=None, driver_version="525.60.13", torch_cuda=(12, 1))
    assert by_id(no_nvml)["driver_cuda_compat"].status is Status.WARN


def test_a_gpu_newer_than_the_torch_build_has_no_kernel_image() -> None:
    blackwell = replace(H100, name="NVIDIA GeForce RTX 5090", compute_capability=(12, 0))
    result = by_id(replace(HEALTHY, gpus=(blackwell,)))["torch_gpu_arch"]
    assert result.status is Status.FAIL and "sm_120" in result.summary["en"]
    ampere_consumer = replace(H100, compute_capability=(8, 9))  # sm_89 runs sm_86 code
    assert by_id(replace(HEALTHY, gpus=(ampere_consumer,)))["torch_gpu_arch"].status is Status.OK
    cpu_build = replace(HEALTHY, torch_cuda=None, torch_version="2.3.1+cpu")
    assert by_id(cpu_build)["torch_gpu_arch"].status is Status.FAIL


def test_architecture_specific_builds_are_read_not_a_crash() -> None:
    # torch.cuda.get_arch_list() of recent CUDA 12.8+ builds: 'sm_90a', 'sm_100a', 'sm_120f' beside plain ones.
    recent = ("sm_80", "sm_86", "sm_90a", "sm_100a", "sm_120f", "compute_120")
    h200 = replace(H100, name="NVIDIA H200", compute_capability=(9, 0))
    assert by_id(replace(HEALTHY, torch_arch_list=recent, gpus=(h200,)))["torch_gpu_arch"].status is Status.OK
    sm_103 = replace(H100, name="a 10.3 card", compute_capability=(10, 3))  # sm_100a code runs on 10.0 only
    assert by_id(replace(HEALTHY, torch_arch_list=("sm_90a", "sm_100a"), gpus=(sm_103,)))["torch_gpu_arch"].status \
        is Status.FAIL


def test_driver_library_mismatch_after_an_unattended_upgrade() -> None:
    broken = replace(HEALTHY, nvml_error="Failed to initialize NVML: Driver/library version mismatch", gpus=None,
                     nvml_library_version=None, unknown={"gpus": "NVML: Driver/library version mismatch"})  # fmt: skip
    assert by_id(broken)["driver_library_match"].status is Status.FAIL
    differs = replace(HEALTHY, kernel_module_version="535.104.05", nvml_library_version="535.129.03")
    assert by_id(differs)["driver_library_match"].status is Status.FAIL


def test_container_limits() -> None:
    docker_default = by_id(replace(HEALTHY, shm_total=64 * MIB, shm_free=60 * MIB))["shm_size"]
    assert docker_default.status is Status.FAIL and "--shm-size" in docker_default.fix["en"]
    assert by_id(replace(HEALTHY, shm_total=512 * MIB))["shm_size"].status is Status.WARN
    limited = by_id(replace(HEALTHY, cgroup_memory_limit=4 * GIB))["cgroup_memory_limit"]
    assert limited.status is Status.WARN and "4.0 GiB" in limited.summary["en"]
    assert by_id(replace(HEALTHY, nofile_soft=1024))["open_files_limit"].status is Status.WARN
    assert by_id(replace(HEALTHY, nofile_soft=256))["open_files_limit"].status is Status.FAIL


def test_disk_space_against_the_last_checkpoint() -> None:
    tight = replace(HEALTHY, disks=(Disk("/data/ckpt", 30 * GIB, 4000 * GIB),))  # < 2 x 20 GiB
    assert by_id(tight)["disk_space"].status is Status.FAIL
    roomy = replace(HEALTHY, disks=(Disk("/data/ckpt", 90 * GIB, 4000 * GIB),))  # < 5 x 20 GiB
    assert by_id(roomy)["disk_space"].status is Status.WARN


def test_session_checks() -> None:
    assert by_id(replace(HEALTHY, multiplexer=None))["ssh_session"].status is Status.WARN
    assert by_id(replace(HEALTHY, multiplexer=None, under_trainguard=True))["ssh_session"].status is Status.OK
    killer = replace(HEALTHY, kill_user_processes=True, lingering=False)
    assert "KillUserProcesses" in by_id(killer)["ssh_session"].summary["en"]


def test_gpu_health() -> None:
    hot = replace(H100, temperature_c=86, throttle_reasons=0x1 | 0x40)
    results = by_id(replace(HEALTHY, gpus=(hot,)))
    assert results["gpu_temperature"].status is Status.WARN
    assert "HW thermal slowdown" in results["gpu_throttle"].summary["en"]
    assert by_id(replace(HEALTHY, gpus=(replace(H100, ecc_uncorrected_volatile=3),)))["gpu_ecc"].status is Status.FAIL
    assert by_id(replace(HEALTHY, gpus=(replace(H100, remapped_rows_pending=True),)))["gpu_ecc"].status is Status.WARN
    assert by_id(replace(HEALTHY, gpus=(replace(H100, pcie_width=8),)))["gpu_pcie_link"].status is Status.WARN
    assert by_id(replace(HEALTHY, gpus=(replace(H100, pcie_gen=1),)))["gpu_pcie_link"].status is Status.OK  # idle
    shared = replace(H100, processes=(GpuProcess(4242, "python", 30 * GIB),))
    assert "python[4242]" in by_id(replace(HEALTHY, gpus=(shared,)))["gpu_other_processes"].summary["en"]


def test_xid_history_is_read_through_the_catalogue() -> None:
    fell_off = XidEvent(
        79, "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    result = by_id(replace(HEALTHY, xids=(fell_off,)))["gpu_xid_history"]
    assert result.status is Status.FAIL and "GPU has fallen off the bus" in result.detail["en"]
    app_error = XidEvent(13, "NVRM: Xid (PCI:0000:cb:00): 13, pid=1797828, name=python, Graphics Exception")
    assert by_id(replace(HEALTHY, xids=(app_error,)))["gpu_xid_history"].status is Status.WARN


def test_could_not_look_is_unknown_with_the_reason_never_ok() -> None:
    cpu_machine = Facts(unknown={"gpus": "no NVIDIA driver", "driver_version": "no NVIDIA driver",
                                 "xids": "cannot read the kernel log"})  # fmt: skip
    results = by_id(cpu_machine)
    for check_id in ("gpu_temperature", "gpu_ecc", "driver_cuda_compat", "gpu_xid_history", "shm_size"):
        assert results[check_id].status is Status.UNKNOWN, check_id
    assert "no NVIDIA driver" in results["gpu_temperature"].summary["en"]
    assert "无法检查" in results["gpu_temperature"].summary["zh"]


def test_doctor_says_what_a_user_without_the_kernel_log_cannot_see() -> None:
    closed = replace(HEALTHY, kernel_log_readable=False, xids=None, oom_counter="/sys/fs/cgroup/user.slice/memory.events")
    result = by_id(closed)["kernel_log_access"]
    assert result.status is Status.WARN
    assert "Xid" in result.summary["en"] and "memory.events" in result.summary["en"] and result.fix["en"]
    nothing = by_id(replace(closed, oom_counter=None))["kernel_log_access"]
    assert nothing.status is Status.WARN and "kill -9" in nothing.summary["en"]
    assert by_id(HEALTHY)["kernel_log_access"].status is Status.OK
