"""The classifier's rules, on real log shapes: roots beat their echoes, kernel records settle it."""

from __future__ import annotations

from trainguard.diagnosis.classify import classify
from trainguard.diagnosis.evidence import ExitStatus, KernelLine
from trainguard.postmortem import LogSource, investigate

OOM_RANK = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 1 has a total capacity of 79.19 GiB"
NCCL_TIMEOUT = (
    "[rank0]:[E1129 02:47:21.715 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1842, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600085 milliseconds before timing out."
)
SIGTERM_TEARDOWN = "W1129 02:47:23.102000 140213 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 140281 closing signal SIGTERM"
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "


def diagnose(text: str, **kwargs):
    return investigate([LogSource(None, [text.encode()])], **kwargs).diagnosis


def test_one_rank_oom_then_nccl_timeouts_and_launcher_sigterm_is_the_oom() -> None:
    # The NCCL timeouts come first in many logs (other ranks notice first); still the OOM is the root.
    log = "\n".join([NCCL_TIMEOUT] * 7 + [OOM_RANK, SIGTERM_TEARDOWN, SIGTERM_TEARDOWN, CHILD_FAILED]) + "\n"
    result = diagnose(log, exit_status=ExitStatus.from_number(1))
    assert result.cause == "cuda_oom"
    assert dict(result.alternatives).get("nccl_failure", 0) < 0.5
    assert any("CUDA out of memory" in e.text for e in result.evidence)


def test_nccl_timeout_alone_is_an_nccl_failure() -> None:
    result = diagnose(NCCL_TIMEOUT + "\n" + SIGTERM_TEARDOWN + "\n" + CHILD_FAILED + "\n")
    assert result.cause == "nccl_failure"


def test_ecc_error_then_sigterm_teardown_is_hardware_not_preemption() -> None:
    log = "RuntimeError: CUDA error: uncorrectable ECC error encountered\n" + (SIGTERM_TEARDOWN + "\n") * 4
    assert diagnose(log).cause == "gpu_hardware"


def test_torchrun_summary_alone_is_not_a_python_error() -> None:
    # ChildFailedError only says that a child failed; with nothing else we do not know why.
    assert diagnose(CHILD_FAILED + "\n").cause == "unknown"


def test_a_bare_killed_is_host_oom_with_modest_confidence() -> None:
    result = diagnose("epoch 3: 100%|██████| 3000/3000\nKilled\n")
    assert result.cause == "host_oom"
    assert 0.4 <= result.confidence <= 0.7


def test_killed_with_an_oom_killer_record_naming_the_process_is_certain() -> None:
    log = "/var/spool/slurmd/job00191/slurm_script: line 28:  8156 Killed                  python3 main.py\n"
    kernel = [
        KernelLine(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,task=python3,pid=8156,uid=1000"
        ),
        KernelLine("Memory cgroup out of memory: Killed process 8156 (python3) total-vm:82132kB, anon-rss:65152kB"),
    ]
    result = diagnose(log, kernel_lines=kernel)
    assert result.cause == "host_oom"
    assert result.confidence >= 0.99
    assert any(e.source == "kernel" and "8156" in e.text for e in result.evidence)


def test_an_oom_record_for_another_process_does_not_decide_for_the_job() -> None:
    kernel = [KernelLine("Out of memory: Killed process 999 (chrome) total-vm:1kB, anon-rss:1kB")]
    result = investigate(
        [LogSource(None, [b"Traceback (most recent call last):\nKeyError: 'label'\n"])],
        kernel_lines=kernel,
        job_pids={4242},
    ).diagnosis
    assert result.cause == "python_error"


def test_xid_79_in_the_kernel_log_names_gpu_hardware_with_its_meaning() -> None:
    kernel = [
        KernelLine("NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    ]
    result = diagnose("RuntimeError: CUDA error: unknown error\n", kernel_lines=kernel)
    assert result.cause == "gpu_hardware"
    assert any(e.note and "fallen off the bus" in e.note for e in result.evidence)


def test_exit_status_alone_decides_when_the_log_is_silent() -> None:
    assert diagnose("step 100 loss 0.1\n", exit_status=ExitStatus.from_number(-11)).cause == "segfault"
    assert diagnose("step 100 loss 0.1\n", exit_status=ExitStatus.from_number(129)).cause == "sighup"
    assert diagnose("step 100 loss 0.1\n", exit_status=ExitStatus.from_number(143)).cause == "preempted"
    assert diagnose("step 100 loss 0.1\n", exit_status=ExitStatus.from_number(135)).cause == "shm_exhausted"
    assert diagnose("step 100 loss 0.1\n", exit_status=ExitStatus.from_number(0)).cause == "unknown"


def test_nothing_to_go_on_is_unknown_with_no_evidence() -> None:
    result = classify([])
    assert (result.cause, result.confidence, result.evidence) == ("unknown", 0.0, ())


def test_no_space_on_dev_shm_is_shared_memory_not_disk() -> None:
    result = diagnose("RuntimeError: unable to write to file </torch_18693_3986104929>: No space left on device (28)\n")
    assert result.cause == "shm_exhausted"


def test_the_last_exception_is_among_the_evidence() -> None:
    log = "".join(f"ValueError: bad sample {i}\n" for i in range(20)) + "KeyError: 'final'\n"
    result = diagnose(log)
    assert result.cause == "python_error"
    assert result.evidence[-1].text == "KeyError: 'final'"


def test_exit_status_numbers_follow_shell_and_python_conventions() -> None:
    assert ExitStatus.from_number(137).signal_name == "SIGKILL"
    assert ExitStatus.from_number(-9).signal_name == "SIGKILL"
    assert ExitStatus.from_number(1).code == 1
    assert ExitStatus.from_number(128).code == 128
    for bad in (-65, 256, 1000):
        try:
            ExitStatus.from_number(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")


def test_an_oom_summary_without_a_pid_does_not_blame_a_job_with_known_pids() -> None:
    kernel = [
        KernelLine("python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"),
        KernelLine("Memory cgroup out of memory: Killed process 999 (python3) total-vm:82132kB, anon-rss:65152kB"),
    ]
    result = investigate(
        [LogSource(None, [b"Fatal Python error: Segmentation fault\n"])],
        exit_status=ExitStatus.from_number(-11),
        kernel_lines=kernel,
        job_pids={4242},
    ).diagnosis
    assert result.cause == "segfault"


def test_another_process_oom_kill_does_not_outweigh_the_jobs_own_sigterm() -> None:
    # One OOM kill prints three kernel lines; about someone else, they add up to nothing.
    kernel = [
        KernelLine("python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"),
        KernelLine(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,task=python3,pid=999,uid=0"
        ),
        KernelLine("Memory cgroup out of memory: Killed process 999 (python3) total-vm:82132kB, anon-rss:65152kB"),
    ]
    result = investigate(
        [LogSource(None, [b"attempt 1 step 2\n"])],
        exit_status=ExitStatus.from_number(-15),
        kernel_lines=kernel,
        job_pids={4242},
    ).diagnosis
    assert result.cause == "preempted" and result.alternatives == ()
