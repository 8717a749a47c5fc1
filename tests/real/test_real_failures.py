"""Real failures on this machine, diagnosed from what they really leave behind: the job's log, the
live kernel log and the exit status. Nothing here is imitated."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import trainguard_cmd
from tests.real import faults

pytestmark = pytest.mark.real


def diagnose(*args: str) -> dict:
    done = subprocess.run(
        [*trainguard_cmd(), "diagnose", *args, "--json"], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(textwrap.dedent(body))
    return script


def test_oom_kill_in_a_memory_cgroup_is_host_oom_for_certain_with_the_kernel_record(tmp_path: Path) -> None:
    if reason := faults.why_no_memory_cgroup():
        pytest.skip(reason)
    hog = write_script(
        tmp_path,
        "hog.py",
        """
        import time
        print("epoch 0: loading the whole dataset into memory", flush=True)
        chunks = []
        while True:
            chunks.append(bytearray(16 * 1024 * 1024))
            time.sleep(0.005)
    """,
    )
    log = tmp_path / "train.log"
    with faults.memory_cgroup(96 * 1024 * 1024) as procs:
        # bash runs the job as a child (not exec): like a shell script started by hand or by Slurm,
        # it reports "line N: PID Killed" when the kernel kills the job.
        status = faults.run_to_log(["bash", "-c", f'echo $$ > {procs}; "{sys.executable}" {hog}; exit $?'], log)
    assert status == 137, log.read_text()

    bare = diagnose(str(log))
    assert bare["cause"] == "host_oom" and bare["confidence"] < 0.9

    certain = diagnose(str(log), "--kernel-log", "auto", "--exit-code", str(status))
    assert certain["cause"] == "host_oom"
    assert certain["confidence"] >= 0.99
    kernel_text = " ".join(e["text"] for e in certain["evidence"] if e["source"] == "kernel")
    killed_pid = next(e["text"] for e in certain["evidence"] if e["source"] == "log").split()[3]
    assert f"Killed process {killed_pid} " in kernel_text or f"pid={killed_pid}," in kernel_text


def test_dataloader_workers_on_a_1mb_dev_shm_are_shm_exhausted(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the DataLoader reproduction needs torch (pip install -e '.[test]')")
    if reason := faults.why_no_mount_namespace():
        pytest.skip(reason)
    loader = write_script(tmp_path, "loader.py", faults.DATALOADER_JOB)
    log = tmp_path / "train.log"
    status = faults.run_to_log(faults.with_tiny_dev_shm([sys.executable, str(loader)]), log)
    assert status != 0, log.read_text()
    result = diagnose(str(log), "--exit-code", str(status))
    assert result["cause"] == "shm_exhausted", log.read_text()[-2000:]


def test_a_write_past_a_full_dev_shm_dies_of_sigbus_and_is_shm_exhausted(tmp_path: Path) -> None:
    if reason := faults.why_no_mount_namespace():
        pytest.skip(reason)
    writer = write_script(
        tmp_path,
        "shm_writer.py",
        """
        import mmap, os
        print("worker: staging a 4 MB batch in /dev/shm", flush=True)
        fd = os.open("/dev/shm/batch-0", os.O_CREAT | os.O_RDWR)
        os.ftruncate(fd, 4 * 1024 * 1024)   # sparse: succeeds on a 1 MB tmpfs
        view = mmap.mmap(fd, 4 * 1024 * 1024)
        view[:] = b"x" * (4 * 1024 * 1024)   # the page past 1 MB has nowhere to go: SIGBUS
    """,
    )
    log = tmp_path / "train.log"
    status = faults.run_to_log(faults.with_tiny_dev_shm([sys.executable, "-X", "faulthandler", str(writer)]), log)
    assert status in (-signal.SIGBUS, 128 + signal.SIGBUS), (status, log.read_text())
    assert "Bus error" in log.read_text()
    assert diagnose(str(log), "--exit-code", str(status))["cause"] == "shm_exhausted"


def test_a_native_segfault_is_a_segfault(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    crash = "import ctypes; print('step 7', flush=True); ctypes.string_at(0)"
    status = faults.run_to_log([sys.executable, "-X", "faulthandler", "-c", crash], log)
    assert status == -signal.SIGSEGV
    alone = diagnose(str(log))
    assert alone["cause"] == "segfault"  # faulthandler's line alone is enough
    with_status = diagnose(str(log), "--exit-code", str(status))
    # The exit status reports the same SIGSEGV: it confirms the death, it is not a second witness of
    # why. A segfault names no cause for sure (a library built for another CUDA is as likely).
    assert with_status["cause"] == "segfault" and with_status["confidence"] == alone["confidence"] < 0.8


def test_torch_save_to_a_full_disk_is_disk_full(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
    if reason := faults.why_no_root():
        pytest.skip(f"mounting a small tmpfs {reason}")
    log = tmp_path / "train.log"
    with faults.small_tmpfs(tmp_path / "ckpt", "1m") as ckpt:
        save = f"import torch; print('step 1000: saving', flush=True); torch.save({{'w': torch.ones(1 << 20)}}, '{ckpt}/step-1000.pt')"
        status = faults.run_to_log([sys.executable, "-c", save], log)
    assert status == 1
    assert diagnose(str(log))["cause"] == "disk_full", log.read_text()


def test_plain_python_write_to_a_full_disk_is_disk_full(tmp_path: Path) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"mounting a small tmpfs {reason}")
    log = tmp_path / "train.log"
    with faults.small_tmpfs(tmp_path / "out", "256k") as out:
        write = f"open('{out}/metrics.jsonl', 'wb').write(b'x' * (1 << 20))"
        status = faults.run_to_log([sys.executable, "-c", write], log)
    assert status == 1
    assert diagnose(str(log))["cause"] == "disk_full"


def test_running_out_of_file_descriptors_is_too_many_open_files(tmp_path: Path) -> None:
    import resource

    log = tmp_path / "train.log"
    opener = "import tempfile\nfiles = [tempfile.TemporaryFile() for _ in range(10_000)]"

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    status = faults.run_to_log([sys.executable, "-c", opener], log, preexec_fn=low_limit)
    assert status == 1
    assert diagnose(str(log))["cause"] == "too_many_open_files"


def test_a_job_on_a_terminal_that_closes_dies_of_sighup(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    job = "import time\nfor step in range(10_000):\n    print('step', step, flush=True)\n    time.sleep(0.05)"
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child: the job, its terminal the pty, its output to the log
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a login shell, even where the tests run under nohup
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.execv(sys.executable, [sys.executable, "-c", job])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not log.exists() or b"step 3" not in log.read_bytes()):
        select.select([master], [], [], 0.1)
    os.close(master)  # the SSH connection drops: the terminal hangs up
    _, wait_status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) == signal.SIGHUP
    result = diagnose(str(log), "--exit-code", str(-os.WTERMSIG(wait_status)))
    assert result["cause"] == "sighup"


def test_an_exception_in_the_training_code_is_a_python_error(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    script = write_script(
        tmp_path,
        "train.py",
        """
        labels = {"cat": 0, "dog": 1}
        for step, name in enumerate(["cat", "dog", "bird"]):
            print(f"step {step}: label {labels[name]}", flush=True)
    """,
    )
    status = faults.run_to_log([sys.executable, str(script)], log)
    result = diagnose(str(log), "--exit-code", str(status))
    assert result["cause"] == "python_error"
    log_lines = [e["text"] for e in result["evidence"] if e["source"] == "log"]
    assert log_lines[-1] == "KeyError: 'bird'"


def test_sigterm_from_a_scheduler_is_preempted(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("ab") as out:
        job = subprocess.Popen(
            [sys.executable, "-c", "import time\nprint('step 1', flush=True)\ntime.sleep(60)"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        time.sleep(0.5)
        job.send_signal(signal.SIGTERM)
        status = job.wait(timeout=30)
    assert status == -signal.SIGTERM
    assert diagnose(str(log), "--exit-code", str(status))["cause"] == "preempted"
