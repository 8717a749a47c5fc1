"""`trainguard run` against real failures: a closed terminal, a killed supervisor, SIGTERM with a
checkpoint in the grace period, a cgroup OOM kill resumed from its checkpoint, a hang, a bug, a full
disk, a 1 MB /dev/shm. Real processes, real signals, the real kernel."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.real import faults
from tests.real.runs import TICKER, kill_group, run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real


def test_a_job_started_from_a_terminal_survives_the_terminal_closing(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "ticker.py", TICKER)
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child: an SSH session's shell running trainguard
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a login shell, even where the tests run under nohup
        os.execvpe(sys.executable, [sys.executable, "-m", "trainguard", "run", "--", sys.executable, job], os.environ)
    output = b""
    while b"status:" not in output:
        ready, _, _ = select.select([master], [], [], 30)
        assert ready, output
        output += os.read(master, 4096)
    os.waitpid(pid, 0)
    os.close(master)  # the SSH connection drops: the terminal hangs up
    run_id = run_id_from(output.decode())
    info = status(run_id)
    log = Path(info["log_path"])
    size = log.stat().st_size
    time.sleep(1.5)
    try:
        assert log.stat().st_size > size, "the job stopped logging after the terminal closed"
        assert status(run_id)["state"] == "running"
    finally:
        assert tg("stop", run_id).returncode == 0
    final = status(run_id)
    assert final["state"] == "stopped" and final["attempts"][0]["cause"] is None


def test_the_job_outlives_a_supervisor_killed_with_sigkill(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "ticker.py", TICKER)
    started = tg("run", "--", sys.executable, job)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    info = status(run_id)
    registry_row = json.loads(tg("ps", "--json").stdout)[0]
    assert registry_row["id"] == run_id
    job_pid = info["pid"]
    supervisor_pid = _supervisor_pid(home, run_id)
    try:
        os.kill(supervisor_pid, signal.SIGKILL)
        wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
        log = Path(info["log_path"])
        size = log.stat().st_size
        time.sleep(1.0)
        assert log.stat().st_size > size, "the job stopped logging when its supervisor died"
        os.kill(job_pid, 0)  # still alive
    finally:
        kill_group(job_pid)


def _supervisor_pid(home: Path, run_id: str) -> int:
    import sqlite3

    with sqlite3.connect(home / "runs.sqlite") as db:
        return db.execute("SELECT supervisor_pid FROM runs WHERE id = ?", (run_id,)).fetchone()[0]


CHECKPOINTING = """
    import os, time
    from trainguard import Checkpointer
    ckpt = Checkpointer(every="1h")
    state = ckpt.load_latest()
    start = state["step"] + 1 if state else 0
    print("attempt", os.environ["TRAINGUARD_ATTEMPT"], "from", start, flush=True)
    for step in range(start, 100_000):
        print("step", step, flush=True)
        ckpt.maybe_save(step, lambda: {"step": step})
        if ckpt.stop_requested:
            print("saved at step", step, flush=True)
            break
        time.sleep(0.05)
"""


def test_sigterm_to_the_run_lets_the_job_checkpoint_within_the_grace_and_ends_stopped(
    tmp_path: Path, home: Path
) -> None:
    job = script(tmp_path, "train.py", CHECKPOINTING)
    started = tg("run", "--grace", "30s", "--", sys.executable, job)
    run_id = run_id_from(started.stdout)
    log = Path(status(run_id)["log_path"])
    wait_for(lambda: b"step 10" in log.read_bytes(), what="step 10")
    stopped = tg("stop", run_id)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    final = status(run_id)
    assert final["state"] == "stopped" and len(final["attempts"]) == 1
    saved_at = int(log.read_text().split("saved at step ")[1].split()[0])
    checkpoints = sorted((home / "runs" / run_id / "checkpoints").glob("step-*"))
    assert checkpoints and int(checkpoints[-1].name.split("-")[1]) == saved_at
    # a second stop of a stopped run is refused in one line
    again = tg("stop", run_id)
    assert again.returncode == 2 and again.stderr.count("\n") == 1


def test_an_exception_in_the_code_is_not_restarted_and_is_named(tmp_path: Path, home: Path) -> None:
    job = script(
        tmp_path,
        "buggy.py",
        """
        import trainguard  # under trainguard run this records the exception in the error file
        print("step 0", flush=True)
        labels = {"cat": 0}
        print(labels["bird"])
    """,
    )
    done = tg("run", "--foreground", "--", sys.executable, job)
    assert done.returncode == 78  # EX_CONFIG: the verdict of a run that needs a fix first (DESIGN section 5)
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert run["state"] == "failed" and len(run["attempts"]) == 1
    assert run["attempts"][0]["cause"] == "python_error"
    assert Path(home / "runs" / run["id"] / "attempt-1.error.json").exists()


def test_a_cgroup_oom_kill_is_host_oom_and_the_next_attempt_resumes_from_the_checkpoint(
    tmp_path: Path, home: Path
) -> None:
    if reason := faults.why_no_memory_cgroup():
        pytest.skip(reason)
    job = script(tmp_path, "train.py", faults.OOM_ONCE_JOB)
    with faults.memory_cgroup(160 * 1024 * 1024) as procs:
        # The supervisor and its job run inside the limit, like a job in a container.
        done = subprocess.run(
            ["bash", "-c", f'echo $$ > {procs}; exec "{sys.executable}" -m trainguard run --foreground -- "{sys.executable}" {job}'],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(tg("ps", "--json").stdout)[0]
    first, second = run["attempts"]
    assert first["signal"] == signal.SIGKILL and first["cause"] == "host_oom"
    assert first["confidence"] >= 0.99  # the kernel's OOM record names the job's process
    assert second["resumed_from"].endswith("step-000000000005")
    log = tg("logs", run["id"]).stdout  # every attempt's own log, each after its marker line
    assert "previous attempt died: host_oom" in log and "finished" in log
    assert run["state"] == "succeeded"


def test_a_hung_job_is_detected_its_stacks_dumped_and_restarted(tmp_path: Path, home: Path) -> None:
    job = script(
        tmp_path,
        "hang.py",
        """
        import os, time
        print("attempt", os.environ["TRAINGUARD_ATTEMPT"], flush=True)
        if os.environ["TRAINGUARD_ATTEMPT"] == "1":
            time.sleep(3600)  # a collective that never completes
        print("finished", flush=True)
    """,
    )
    done = tg("run", "--foreground", "--hang-timeout", "2s", "--grace", "2s", "--", sys.executable, job)
    assert done.returncode == 0, done.stderr
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert [a["cause"] for a in run["attempts"]] == ["hang", None]
    assert run["state"] == "succeeded"
    dump = (home / "runs" / run["id"] / "hang-attempt-1.txt").read_text()
    assert "py-spy" in dump or "Thread" in dump


def test_checkpoints_to_a_full_disk_are_disk_full_and_not_retried(tmp_path: Path, home: Path) -> None:
    pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
    if reason := faults.why_no_root():
        pytest.skip(f"mounting a small tmpfs {reason}")
    job = script(
        tmp_path,
        "save.py",
        """
        import os, torch
        print("step 1000: saving", flush=True)
        torch.save({"w": torch.ones(1 << 20)}, os.path.join(os.environ["TRAINGUARD_CHECKPOINT_DIR"], "model.pt"))
    """,
    )
    with faults.small_tmpfs(tmp_path / "ckpt", "1m") as folder:
        done = tg("run", "--foreground", "--checkpoint-dir", str(folder), "--", sys.executable, job)
    assert done.returncode == 78  # EX_CONFIG: fix first
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert [a["cause"] for a in run["attempts"]] == ["disk_full"]


def test_dataloader_workers_on_a_1mb_dev_shm_are_shm_exhausted_and_not_retried(tmp_path: Path, home: Path) -> None:
    pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
    if reason := faults.why_no_mount_namespace():
        pytest.skip(reason)
    job = script(tmp_path, "loader.py", faults.DATALOADER_JOB)
    command = faults.with_tiny_dev_shm([sys.executable, "-m", "trainguard", "run", "--foreground", "--",
                                        sys.executable, job])  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 78, done.stderr  # EX_CONFIG: fix first
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert [a["cause"] for a in run["attempts"]] == ["shm_exhausted"]


def test_bad_input_is_one_line_and_leaves_no_run(tmp_path: Path, home: Path) -> None:
    cases = [
        (["run", sys.executable, "-c", "pass"], "put --"),
        (["run", "--", "no-such-program-xyz"], "command not found"),
        (["run", "--", str(tmp_path)], "not an executable"),
        (["run", "--", "./missing.sh"], "no such command"),
        (["run", "--hang-timeout", "soon", "--", "true"], "--hang-timeout"),
        (["run", "--grace", "-5s", "--", "true"], "--grace"),
        (["run", "--retry", "oom=maybe", "--", "true"], "--retry"),
        (["status", "nosuchrun"], "no run"),
        (["logs", "nosuchrun"], "no run"),
        (["stop", "nosuchrun"], "no run"),
    ]
    for args, message in cases:
        done = tg(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and message in done.stderr and "Traceback" not in done.stderr, args
    assert json.loads(tg("ps", "--json").stdout) == []


def test_an_unwritable_state_dir_is_one_line(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TRAINGUARD_HOME", str(blocker / "state"))
    done = tg("run", "--", "true")
    assert done.returncode == 2 and "state folder" in done.stderr and done.stderr.count("\n") == 1


def test_two_stops_at_once_one_wins_and_the_other_says_so(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "ticker.py", TICKER)
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    first = subprocess.Popen([sys.executable, "-m", "trainguard", "stop", run_id], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    second = subprocess.Popen([sys.executable, "-m", "trainguard", "stop", run_id], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    results = sorted([first.wait(60), second.wait(60)])
    assert results == [0, 2]
    assert status(run_id)["state"] == "stopped"


def test_memory_limit_puts_the_job_in_its_own_cgroup_and_names_the_kill(tmp_path: Path, home: Path) -> None:
    if reason := faults.why_no_memory_cgroup():
        pytest.skip(reason)
    job = script(
        tmp_path,
        "grow.py",
        """
        import os
        attempt = int(os.environ["TRAINGUARD_ATTEMPT"])
        print("attempt", attempt, flush=True)
        hog = [bytearray(16 * 1024 * 1024) for _ in range(20 if attempt == 1 else 2)]  # 320 MB, then 32 MB
        print("finished", flush=True)
    """,
    )
    done = tg("run", "--foreground", "--memory-limit", "128M", "--", sys.executable, job)
    assert done.returncode == 0, done.stderr
    run = json.loads(tg("ps", "--json").stdout)[0]
    first = run["attempts"][0]
    assert first["signal"] == signal.SIGKILL and first["cause"] == "host_oom" and first["confidence"] >= 0.99
    assert run["state"] == "succeeded" and len(run["attempts"]) == 2


def test_diagnose_a_run_by_its_id(tmp_path: Path, home: Path) -> None:
    job = script(
        tmp_path,
        "crash.py",
        """
        import ctypes
        print("step 1", flush=True)
        ctypes.string_at(0)
    """,
    )
    tg("run", "--foreground", "--restart", "never", "--", sys.executable, "-X", "faulthandler", job)
    run_id = json.loads(tg("ps", "--json").stdout)[0]["id"]
    result = json.loads(tg("diagnose", run_id, "--json").stdout)
    assert result["cause"] == "segfault"
    assert {"log", "exit"} <= {e["source"] for e in result["evidence"]}


def test_a_run_left_running_by_an_earlier_boot_is_closed_as_node_reboot(tmp_path: Path, home: Path) -> None:
    from trainguard.store.registry import Attempt, Registry

    registry = Registry(home)
    run = registry.create_run(["python", "train.py"], name="before-reboot", cwd=str(tmp_path), options={})
    registry.update_run(run.id, boot_id="00000000-previous-boot", state="running")
    registry.start_attempt(run.id, Attempt(n=1, started_at=time.time() - 3600, pid=999_999))
    info = json.loads(tg("status", "before-reboot", "--json").stdout)
    assert info["state"] == "failed" and "node_reboot" in info["reason"]
    assert info["attempts"][0]["cause"] == "node_reboot"


def test_logs_of_one_attempt_and_following_a_run(tmp_path: Path, home: Path) -> None:
    job = script(
        tmp_path,
        "twice.py",
        """
        import os, time
        attempt = os.environ["TRAINGUARD_ATTEMPT"]
        for step in range(3):
            print(f"attempt {attempt} step {step}", flush=True)
            time.sleep(0.1)
        if attempt == "1":
            os.kill(os.getpid(), 15)  # preempted
        print("finished", flush=True)
    """,
    )
    started = tg("run", "--name", "twice", "--follow", "--", sys.executable, job)
    assert started.returncode == 0
    followed = started.stdout
    assert "attempt 1 step 2" in followed and "attempt 2 step 2" in followed and "finished" in followed
    second = tg("logs", "twice", "--attempt", "2").stdout
    assert "attempt 2 step 0" in second and "attempt 1" not in second
    info = status("twice")
    assert [a["cause"] for a in info["attempts"]] == ["preempted", None] and info["state"] == "succeeded"
    assert info["attempts"][1]["started_at"].endswith("+00:00")
    human = tg("status", "twice").stdout
    assert "attempt 1:" in human and "preempted" in human


def test_adopt_takes_a_run_back_under_watch_and_so_does_a_run_of_the_same_name(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "ticker.py", TICKER)
    run_id = run_id_from(tg("run", "--name", "long", "--", sys.executable, job).stdout)
    job_pid = status(run_id)["pid"]
    try:
        os.kill(_supervisor_pid(home, run_id), signal.SIGKILL)
        wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
        adopted = tg("adopt", run_id)
        assert adopted.returncode == 0, adopted.stderr
        assert status(run_id)["supervisor"] == "alive"
        again = tg("adopt", run_id)
        assert again.returncode == 2 and "already watched" in again.stderr
        # the supervisor dies again; `trainguard run --name long` takes the same job back instead of a second one
        os.kill(_supervisor_pid(home, run_id), signal.SIGKILL)
        wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
        rerun = tg("run", "--name", "long", "--", sys.executable, job)
        assert "taking it back under watch" in rerun.stdout
        assert len(json.loads(tg("ps", "--json").stdout)) == 1
        assert status(run_id)["pid"] == job_pid
        # and the adopted job is stopped like any other
        assert tg("stop", run_id).returncode == 0
        assert status(run_id)["state"] == "stopped"
    finally:
        kill_group(job_pid)


def test_a_script_that_saves_its_own_files_resumes_through_checkpoint_glob_and_resume_arg(
    tmp_path: Path, home: Path
) -> None:
    job = script(
        tmp_path,
        "own.py",
        """
        import argparse, os
        parser = argparse.ArgumentParser()
        parser.add_argument("--resume")
        args = parser.parse_args()
        start = int(open(args.resume).read()) + 1 if args.resume else 0
        print("resume", args.resume, "from", start, flush=True)
        for epoch in range(start, 6):
            with open(os.path.join(os.environ["TRAINGUARD_CHECKPOINT_DIR"], f"epoch{epoch}.txt"), "w") as out:
                out.write(str(epoch))
            if epoch == 2 and not args.resume:
                os.kill(os.getpid(), 9)
        print("finished", flush=True)
    """,
    )
    folder = tmp_path / "ckpt"
    done = tg("run", "--foreground", "--checkpoint-dir", str(folder), "--checkpoint-glob", "epoch*.txt",
              "--resume-arg", "--resume {checkpoint}", "--", sys.executable, job)  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert run["attempts"][1]["resumed_from"] == str(folder / "epoch2.txt")
    log = tg("logs", run["id"]).stdout
    assert f"resume {folder / 'epoch2.txt'} from 3" in log and "finished" in log


def test_the_jobs_stdin_is_dev_null_open_for_reading_and_writing(tmp_path: Path) -> None:
    """As a detached job's always was (a job that writes to fd 0 must not fail)."""
    out = tmp_path / "out"
    run_id = run_id_from(tg("run", "--restart", "never", "--", "sh", "-c",
                            f"readlink /proc/self/fd/0 > {out}; echo x >&0 && echo written >> {out}").stdout)  # fmt: skip
    wait_for(lambda: status(run_id)["state"] not in ("starting", "running"), what="the job")
    assert out.read_text().split() == ["/dev/null", "written"]
    assert status(run_id)["state"] == "succeeded"
