"""How `trainguard run --foreground` exits (DESIGN section 5: 0 / 75 / 78 / 1), for every cause of the
catalogue, and what it leaves in the termination log a Kubernetes pod reports. The table below is the
contract written out again from DESIGN, not read from causes.toml: a change of the data that breaks the
contract fails here. Then real foreground runs end with those codes and write that verdict."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.real.runs import script, tg, wait_for
from trainguard.causes import CAUSE_IDS, catalogue
from trainguard.integrations.kubernetes import MAX_BYTES
from trainguard.supervisor.policy import Outcome, RestartPolicy, decide, verdict_exit_code

CAUSES = catalogue()
TEMPFAIL, CONFIG, FAIL = 75, 78, 1
CONTRACT = {
    "preempted": TEMPFAIL, "node_reboot": TEMPFAIL, "gpu_hardware": TEMPFAIL, "killed": TEMPFAIL,
    "hang": TEMPFAIL, "nccl_failure": TEMPFAIL, "peer_failure": TEMPFAIL, "host_oom": TEMPFAIL,
    "memory_leak": TEMPFAIL,
    "python_error": CONFIG, "bad_command": CONFIG, "cuda_driver_mismatch": CONFIG, "shm_exhausted": CONFIG,
    "disk_full": CONFIG, "too_many_open_files": CONFIG,
    "cuda_oom": FAIL, "cuda_illegal_access": FAIL, "sighup": FAIL, "segfault": FAIL, "unknown": FAIL,
}  # fmt: skip


def test_the_contract_names_every_cause_of_the_catalogue() -> None:
    assert set(CONTRACT) == set(CAUSE_IDS) == set(CAUSES)


@pytest.mark.parametrize("cause", CAUSE_IDS)
def test_a_run_that_failed_with_each_cause_exits_with_its_verdict(cause: str) -> None:
    assert verdict_exit_code("failed", cause, CAUSES) == CONTRACT[cause]
    # whatever the last cause was, a success is 0, `trainguard stop` is 0, a stop from outside is 75
    assert verdict_exit_code("succeeded", cause, CAUSES) == 0
    assert verdict_exit_code("stopped", cause, CAUSES) == 0
    assert verdict_exit_code("stopped", cause, CAUSES, stopped_from_outside=True) == TEMPFAIL


def test_a_failure_with_no_cause_is_1() -> None:
    assert verdict_exit_code("failed", None, CAUSES) == FAIL


@pytest.mark.parametrize("cause", CAUSE_IDS)
def test_under_requeue_only_a_preemption_skips_the_local_restarts(cause: str) -> None:
    """`run --requeue` in a Slurm job: a preempted attempt ends the run at once (75, Slurm requeues);
    every other cause keeps its local retry policy."""
    died = Outcome(exit_code=1, signal=None, cause=cause, new_lines=100)
    local = decide([died], RestartPolicy(), CAUSES)
    slurm = decide([died], RestartPolicy(requeue=True), CAUSES)
    if cause == "preempted":
        assert local.restart and not slurm.restart and slurm.final_state == "failed"
        assert "Slurm" in slurm.reason.en and verdict_exit_code("failed", cause, CAUSES) == TEMPFAIL
    else:
        assert (slurm.restart, slurm.final_state) == (local.restart, local.final_state)


# ---------------------------------------------------------------------------------------------- real runs
def _foreground(tmp_path: Path, body: str, *flags: str, **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    job = script(tmp_path, "job.py", body)
    log = tmp_path / "termination-log"
    done = tg("run", "--foreground", "--termination-log", str(log), *flags, "--", sys.executable, job, **kwargs)
    message = log.read_text()
    assert len(message.encode()) <= MAX_BYTES
    return done, json.loads(message)


def test_a_success_exits_0_and_says_so(tmp_path: Path, home: Path) -> None:
    done, message = _foreground(tmp_path, "print('done')")
    assert done.returncode == 0, done.stderr
    assert message["exit_code"] == 0 and message["state"] == "succeeded" and message["cause"] is None


def test_a_bug_exits_78_with_the_exception_as_the_deciding_line(tmp_path: Path, home: Path) -> None:
    done, message = _foreground(tmp_path, """
        import trainguard
        print("step 0", flush=True)
        print({"cat": 0}["bird"])
    """)  # fmt: skip
    assert done.returncode == 78, done.stderr
    assert message["cause"] == "python_error" and message["exit_code"] == 78 and message["confidence"] > 0.5
    assert "KeyError: 'bird'" in message["evidence"]
    assert message["fix"] == CAUSES["python_error"].fixes["en"][0] and message["title"]


def test_an_exit_with_no_evidence_exits_1(tmp_path: Path, home: Path) -> None:
    done, message = _foreground(tmp_path, "import sys; print('step 1'); sys.exit(3)", "--restart", "never")
    assert done.returncode == 1, done.stderr
    assert message["cause"] == "unknown" and message["exit_code"] == 1


def test_a_huge_exception_line_still_fits_the_4_kb_termination_log(tmp_path: Path, home: Path) -> None:
    done, message = _foreground(tmp_path, """
        import trainguard
        raise ValueError("bad shape: " + "[1, 2, 3] " * 200_000)
    """)  # fmt: skip
    assert done.returncode == 78, done.stderr
    assert message["cause"] == "python_error" and "bad shape" in message["evidence"]
    assert message["evidence"].endswith("…") and message["fix"]


def test_a_sigterm_from_outside_lets_the_job_save_and_exits_75(tmp_path: Path, home: Path) -> None:
    """A pod's deletion (the kubelet's SIGTERM to PID 1), a scheduler's stop: a preemption, 75."""
    job = script(tmp_path, "train.py", """
        import time
        from trainguard import Checkpointer
        ckpt = Checkpointer(every=None, every_steps=1000)
        for step in range(100_000):
            print("step", step, flush=True)
            ckpt.maybe_save(step, lambda: {"step": step})
            if ckpt.stop_requested:
                print("saved at step", step, flush=True)
                break
            time.sleep(0.05)
    """)  # fmt: skip
    log = tmp_path / "termination-log"
    ckpt = tmp_path / "ckpt"
    process = subprocess.Popen(
        [sys.executable, "-m", "trainguard", "run", "--foreground", "--grace", "30s", "--termination-log", str(log),
         "--checkpoint-dir", str(ckpt), "--", sys.executable, job],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: any(home.glob("runs/*/attempt-1.log")) and b"step 5" in
                 next(home.glob("runs/*/attempt-1.log")).read_bytes(), what="step 5")  # fmt: skip
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, stderr
    assert any(ckpt.glob("step-*")), "the job did not save within the grace"
    message = json.loads(log.read_text())
    assert message["cause"] == "preempted" and message["state"] == "stopped" and message["exit_code"] == 75


def test_a_termination_log_that_cannot_be_written_is_a_warning_not_a_crash(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "job.py", "print('done')")
    for path in (tmp_path / "no" / "such" / "folder" / "log", tmp_path):  # missing folder; a folder
        done = tg("run", "--foreground", "--termination-log", str(path), "--", sys.executable, job)
        assert done.returncode == 0, done.stderr  # the verdict, not an error
        warning = [line for line in done.stderr.splitlines() if "termination log" in line]
        assert len(warning) == 1 and "warning" in warning[0] and "Traceback" not in done.stderr
    zh = tg("run", "--foreground", "--termination-log", str(tmp_path), "--", sys.executable, job,
            env={**os.environ, "LANG": "zh_CN.UTF-8"})  # fmt: skip
    assert "警告：无法写入终止日志" in zh.stderr


def test_termination_log_and_requeue_need_foreground(tmp_path: Path, home: Path) -> None:
    for flags in (["--termination-log", str(tmp_path / "log")], ["--requeue"]):
        done = tg("run", *flags, "--", sys.executable, "-c", "pass")
        assert done.returncode == 2 and "--foreground" in done.stderr and done.stderr.count("\n") == 1
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # no run was created


def test_requeue_outside_slurm_warns_and_runs_as_usual(tmp_path: Path, home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = tg("run", "--foreground", "--requeue", "--", sys.executable, "-c", "print('ok')", env=env)
    assert done.returncode == 0 and "no SLURM_JOB_ID" in done.stderr


def test_a_save_request_reaches_the_process_that_handles_it_and_spares_the_others(tmp_path: Path, home: Path) -> None:
    """SIGUSR1 to the supervisor (Slurm's pre-timeout signal): the training process saves and leaves
    (preempted), a child without a handler (a DataLoader worker) is not killed by it, and the run
    goes on: the next attempt resumes from the save and finishes."""
    job = script(tmp_path, "train.py", """
        import os, subprocess, sys, time
        from trainguard import Checkpointer
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # no USR1 handler
        ckpt = Checkpointer(every=None, every_steps=1000)
        state = ckpt.load_latest()
        start = state["step"] + 1 if state else 0
        print("attempt", os.environ["TRAINGUARD_ATTEMPT"], "from", start, flush=True)
        for step in range(start, start + 100_000 if start == 0 else start + 5):
            print("step", step, flush=True)
            ckpt.maybe_save(step, lambda: {"step": step})
            if ckpt.stop_requested:
                time.sleep(0.3)
                print("saved at step", step, "helper alive:", helper.poll() is None, flush=True)
                break
            time.sleep(0.05)
        else:
            print("finished", flush=True)
        helper.kill()
    """)  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--foreground", "--", sys.executable, job],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: any(home.glob("runs/*/attempt-1.log")) and b"step 10" in
                 next(home.glob("runs/*/attempt-1.log")).read_bytes(), what="step 10")  # fmt: skip
        process.send_signal(signal.SIGUSR1)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    first, second = (next(home.glob(f"runs/*/attempt-{n}.log")).read_text() for n in (1, 2))
    assert "SIGUSR1: a save request, passed on to process" in first
    assert "helper alive: True" in first
    saved = int(first.split("saved at step ")[1].split()[0])
    assert f"attempt 2 from {saved + 1}" in second and "finished" in second
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert [a["cause"] for a in run["attempts"]] == ["preempted", None] and run["state"] == "succeeded"


def test_a_save_request_waits_until_the_job_installs_its_handler(tmp_path: Path, home: Path) -> None:
    """The pre-timeout signal can come while the job still imports its libraries: it is passed on
    once the job handles it, not lost and not fatal."""
    job = script(tmp_path, "train.py", """
        import time
        print("importing", flush=True)
        time.sleep(2)  # import torch, build the model: no handler yet
        from trainguard import Checkpointer
        ckpt = Checkpointer(every=None, every_steps=1000)
        for step in range(100_000):
            ckpt.maybe_save(step, lambda: {"step": step})
            if ckpt.stop_requested:
                print("saved at step", step, flush=True)
                break
            time.sleep(0.05)
    """)  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--foreground", "--restart", "never",
                                "--", sys.executable, job], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        wait_for(lambda: any(home.glob("runs/*/attempt-1.log")) and b"importing" in
                 next(home.glob("runs/*/attempt-1.log")).read_bytes(), what="the job to start")  # fmt: skip
        process.send_signal(signal.SIGUSR1)
        started = time.monotonic()
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    log = next(home.glob("runs/*/attempt-1.log")).read_text()
    assert "no process of the job handles SIGUSR1 yet" in log and "passed on to process" in log
    assert "saved at step" in log and time.monotonic() - started < 30
    assert process.returncode == 75, stderr  # preempted, --restart never: another attempt may cure it


def test_a_foreground_run_of_a_name_whose_supervisor_died_watches_the_job_here_and_ends_with_its_verdict(
    tmp_path: Path, home: Path
) -> None:
    """A scheduler reruns `run --foreground --name N` after the first supervisor was killed (Slurm's
    SIGKILL after KillWait): the job left running is watched in the foreground, not detached, and the
    scheduler gets its verdict."""
    job = script(tmp_path, "job.py", """
        import time
        for step in range(40):
            print("step", step, flush=True)
            time.sleep(0.1)
        raise SystemExit(0)
    """)  # fmt: skip
    started = tg("run", "--name", "n1", "--", sys.executable, job)
    assert started.returncode == 0, started.stderr
    import sqlite3

    with sqlite3.connect(home / "runs.sqlite") as db:
        supervisor_pid = db.execute("SELECT supervisor_pid FROM runs WHERE name = 'n1'").fetchone()[0]
    os.kill(supervisor_pid, signal.SIGKILL)
    wait_for(
        lambda: json.loads(tg("status", "n1", "--json").stdout)["supervisor"] == "gone", what="the supervisor gone"
    )
    log = tmp_path / "termination-log"
    began = time.monotonic()
    done = tg("run", "--foreground", "--name", "n1", "--termination-log", str(log), "--", sys.executable, job)
    assert done.returncode == 0, done.stderr
    assert "taking it back under watch" in done.stderr and time.monotonic() - began > 0.5  # it waited for the job
    final = json.loads(tg("status", "n1", "--json").stdout)
    # the job it found running was watched to its end (an adopted job's exit status cannot be had, so
    # the policy may run it once more), and the run ended here with the verdict
    assert final["state"] == "succeeded" and final["supervisor"] == "exited"
    assert json.loads(log.read_text())["state"] == "succeeded"
