"""The classifier's rules, on real log shapes: roots beat their echoes, kernel records settle it."""

from __future__ import annotations

import textwrap

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


def test_every_report_of_one_sigkill_is_one_witness() -> None:
    # The shell's `Killed`, the launcher's exitcode -9 and exit status 137 all say one thing: a
    # SIGKILL came. Three echoes of it must not add up to certainty about who sent it.
    log = "step 41\n[0]<stderr>:Killed\n  exitcode  : -9 (pid: 6421)\n"
    result = diagnose(log, exit_status=ExitStatus.from_number(137))
    assert result.cause == "host_oom"
    assert result.confidence == diagnose("step 41\nKilled\n").confidence <= 0.7


def test_every_report_of_one_segfault_is_one_witness_and_names_no_cause_for_sure() -> None:
    # `Segmentation fault (core dumped)`, faulthandler's line and exit status 139 report one SIGSEGV;
    # the signal names no cause (an extension built for another CUDA is as likely): below 0.8.
    log = "step 41\nFatal Python error: Segmentation fault\nSegmentation fault (core dumped)\n"
    result = diagnose(log, exit_status=ExitStatus.from_number(139))
    assert result.cause == "segfault"
    assert result.confidence == diagnose("step 41\nSegmentation fault\n").confidence < 0.8


def test_a_list_of_possible_causes_is_not_a_report_of_each() -> None:
    # Ray names SIGSEGV among the causes a vanished worker may have had: no segfault was seen.
    ray = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
           "Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes. "
           "(1) The process is killed by SIGKILL by OOM killer due to high memory usage. (2) ray stop --force is called. "
           "(3) The worker is crashed unexpectedly due to SIGSEGV or other unexpected errors.\n")  # fmt: skip
    d = diagnose(ray)
    assert d.cause == "host_oom" and d.confidence < 0.6
    assert "segfault" in dict(d.alternatives)


def test_options_run_as_commands_mean_a_broken_launch_script_not_a_python_error() -> None:
    log = ("train.py: error: the following arguments are required: -t/--task_name, -b/--batch_size\n"
           "./scripts/train.sh: line 2: --task_name: command not found\n"
           "./scripts/train.sh: line 3: --batch_size: command not found\n")  # fmt: skip
    assert diagnose(log, exit_status=ExitStatus.from_number(127)).cause == "bad_command"


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
    assert any(e.note and "fallen off the bus" in e.note.en for e in result.evidence)


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
    # Windows prints its access violation (0xC0000005) unsigned or as a signed 32-bit number
    assert ExitStatus.from_number(3221225477).code == ExitStatus.from_number(-1073741819).code == 0xC0000005
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


# ------------------------------------------------------------------ classes of real-world misses
def _judge(text: str, **kwargs):
    return investigate([LogSource(None, [text.encode()])], **kwargs)


def test_a_bare_killed_in_another_locale_is_a_sigkill_read_as_host_oom() -> None:
    d = _judge("[>>>>>>>>>> ] 1022/5000, 1.5 task/s, elapsed: 673s, ETA: 2621s已杀死\n").diagnosis
    assert d.cause == "host_oom" and 0.4 <= d.confidence < 0.8


def test_a_sigkill_is_killed_when_a_readable_kernel_log_holds_no_oom_kill() -> None:
    log = "step 41\nstep 42\nKilled\n"
    unreadable = _judge(log, exit_status=ExitStatus(signal=9)).diagnosis
    readable = _judge(log, exit_status=ExitStatus(signal=9), kernel_lines=[], kernel_readable=True).diagnosis
    assert unreadable.cause == "host_oom" and readable.cause == "killed"
    oom = KernelLine("Out of memory: Killed process 4242 (python) total-vm:9GB, anon-rss:8GB", time=1.0)
    with_record = _judge(log, exit_status=ExitStatus(signal=9), kernel_lines=[oom], kernel_readable=True,
                         job_pids={4242}).diagnosis  # fmt: skip
    assert with_record.cause == "host_oom" and with_record.confidence >= 0.99


def test_enospc_under_multiprocessing_semlock_is_shared_memory() -> None:
    log = textwrap.dedent("""\
        File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 57, in __init__
          sl = self._semlock = _multiprocessing.SemLock(
        OSError: [Errno 28] No space left on device
    """)
    assert _judge(log).diagnosis.cause == "shm_exhausted"
    assert _judge("torch.save(state, path)\nOSError: [Errno 28] No space left on device\n").diagnosis.cause == "disk_full"


def test_tensorflow_resource_exhausted_on_a_file_path_is_a_full_disk() -> None:
    disk = ("W tensorflow/core/framework/op_kernel.cc:1753] OP_REQUIRES failed at save_restore_v2_ops.cc:134 : "
            "Resource exhausted: checkpoints/model_temp_1b4ee8/part-00000-of-00001.data-00000-of-00001.tempstate4953\n")  # fmt: skip
    gpu = "ResourceExhaustedError: OOM when allocating tensor with shape[8,509,3072] and type float on /job:localhost/replica:0/task:0/device:GPU:0\n"
    assert _judge(disk).diagnosis.cause == "disk_full"
    assert _judge(gpu).diagnosis.cause == "cuda_oom"


def test_an_ambiguous_cuda_library_status_is_hesitant_and_names_its_alternatives() -> None:
    d = _judge("RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED\n").diagnosis
    assert d.confidence < 0.6
    assert {"cuda_driver_mismatch", "gpu_hardware"} <= {cause for cause, _ in d.alternatives} | {d.cause}


def test_pcie_aer_fatal_errors_in_the_kernel_log_are_gpu_hardware() -> None:
    aer = [KernelLine("pcieport 0000:00:03.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer", 5.0),
           KernelLine("pcieport 0000:00:03.1: AER: can't recover (no error_detected callback)", 5.1)]  # fmt: skip
    d = _judge("epoch 3 step 1200 loss 0.41\n", kernel_lines=aer, kernel_readable=True).diagnosis
    assert d.cause == "gpu_hardware"


def test_xid_45_beside_xid_79_reads_as_79() -> None:
    kernel = [KernelLine("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", 1.0),
              KernelLine("NVRM: Xid (PCI:0000:3b:00): 45, pid=4242, name=python, Ch 00000010", 1.1)]  # fmt: skip
    d = _judge("RuntimeError: CUDA error: unspecified launch failure\n", kernel_lines=kernel, kernel_readable=True).diagnosis
    assert d.cause == "gpu_hardware" and any(e.note and "Xid 79" in e.note.en for e in d.evidence)


def test_a_slurm_cancel_without_a_reason_is_a_hesitant_preemption() -> None:
    d = _judge("slurmstepd: error: *** JOB 3 ON c1 CANCELLED AT 2025-02-13T15:47:35 ***\n").diagnosis
    assert d.cause == "preempted" and d.confidence <= 0.7
    assert "killed" in {cause for cause, _ in d.alternatives}


def test_cloud_preemption_notices_are_preempted() -> None:
    for line in ("UserError: AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted.",
                 "Status Reason: Host EC2 Terminated", "MOAB_INFO:  job exceeded wallclock limit"):  # fmt: skip
        assert _judge(line + "\n").diagnosis.cause == "preempted", line


def test_a_lost_peer_with_nothing_else_is_peer_failure_and_an_echo_beside_a_root() -> None:
    alone = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:36042\n"
    assert _judge(alone).diagnosis.cause == "peer_failure"
    with_root = alone + "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB.\n"
    assert _judge(with_root).diagnosis.cause == "cuda_oom"


def test_a_command_that_cannot_start_is_bad_command() -> None:
    d = _judge("python: can't open file '/work/nosuchfile.py': [Errno 2] No such file or directory\n",
               exit_status=ExitStatus(code=2)).diagnosis  # fmt: skip
    assert d.cause == "bad_command"
    assert _judge("run.sh: line 18: deepspeed: command not found\n", exit_status=ExitStatus(code=127)).diagnosis.cause == "bad_command"


def test_an_unlinked_oom_kill_in_the_kernel_log_does_not_outweigh_the_jobs_cuda_oom() -> None:
    others = [KernelLine(f"Memory cgroup out of memory: Killed process {pid} (java) total-vm:9GB, anon-rss:8GB", 2.0)
              for pid in (101, 102, 103)]  # fmt: skip
    others.append(KernelLine("oom-kill:constraint=CONSTRAINT_MEMCG,task=java,pid=101,uid=0", 2.0))
    log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB\n"
    d = _judge(log, kernel_lines=others, kernel_readable=True).diagnosis
    assert d.cause == "cuda_oom" and d.confidence >= 0.9


def test_the_first_failing_rank_is_named_from_the_logs_timestamps() -> None:
    rank0 = ("[rank0]:[E1201 10:00:42.120000 811 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
             "timeout: WorkNCCL(SeqNum=99, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds\n")  # fmt: skip
    rank1 = ("[rank1]:[E1201 09:50:41.950000 812 train.py:88] step 412\n"
             "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 1 has a total capacity of 23.6 GiB\n")  # fmt: skip
    report = investigate([LogSource("rank0.log", [rank0.encode()]), LogSource("rank1.log", [rank1.encode()])])
    assert report.diagnosis.cause == "cuda_oom"
    assert report.first_failure["rank"] == 1 and report.first_failure["file"] == "rank1.log"


def test_a_specific_row_reads_its_line_even_where_a_heavier_generic_row_matches_it() -> None:
    # "NCCL error" alone would say nccl_failure at 0.85; "unhandled system error" is a failed system
    # call that was as often /dev/shm in a container as the network: read both ways, at neither 0.85.
    line = "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8\n"
    result = diagnose(line)
    assert (result.cause, result.confidence) == ("nccl_failure", 0.5)
    assert dict(result.alternatives)["shm_exhausted"] == 0.45
    socket = "socketStartConnect: Connect to 192.168.19.14<52822> failed : No route to host\n"
    assert diagnose(line + socket).confidence > 0.8  # the network says which
