"""The supervisor's judgement on real deaths that a log alone reads wrong: someone else's OOM kills in
the kernel log, a kill -9 by a person, a command that cannot start, and a job that saved and left on
a scheduler's SIGTERM (exit 0, but not finished)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.real import faults
from tests.real.runs import run_id_from, script, status, tg, wait_for
from trainguard.probes import kernel_log

pytestmark = pytest.mark.real

CUDA_OOM_LOG = Path(__file__).resolve().parents[2] / "src" / "trainguard" / "data" / "examples" / "ddp_cuda_oom.log"


def _kernel_log_readable() -> bool:
    try:
        kernel_log.read_live()
    except kernel_log.KernelLogUnavailable:
        return False
    return True


def test_someone_elses_oom_kills_do_not_outweigh_the_jobs_cuda_oom(tmp_path: Path) -> None:
    """The README's `diagnose LOG --kernel-log auto` on a machine whose kernel log holds OOM kills of
    other processes in other cgroups, around the time the job's log was written."""
    if reason := faults.why_no_memory_cgroup():
        pytest.skip(reason)
    if not _kernel_log_readable():
        pytest.skip("the kernel log cannot be read here")
    hog = script(tmp_path, "hog.py", "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n")
    with faults.memory_cgroup(64 * 1024 * 1024) as procs:  # another user's job, killed in its own cgroup
        for _ in range(2):
            subprocess.run(["bash", "-c", f'echo $$ > {procs}; exec "{sys.executable}" {hog}'], check=False,
                           capture_output=True)  # fmt: skip
    log = tmp_path / "train.log"
    log.write_bytes(CUDA_OOM_LOG.read_bytes())
    done = tg("diagnose", str(log), "--kernel-log", "auto", "--json")
    assert done.returncode == 0, done.stderr
    diagnosis = json.loads(done.stdout)
    assert diagnosis["cause"] == "cuda_oom" and diagnosis["confidence"] >= 0.9, diagnosis


def test_a_kill_9_by_a_person_is_killed_and_restarted(tmp_path: Path, home: Path) -> None:
    if not _kernel_log_readable():
        pytest.skip("`killed` needs a readable kernel log (without one a SIGKILL stays host_oom)")
    job = script(tmp_path, "ticker.py", """
        import os, time
        for step in range(100_000):
            print("attempt", os.environ["TRAINGUARD_ATTEMPT"], "step", step, flush=True)
            time.sleep(0.05)
    """)  # fmt: skip
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    pid = wait_for(lambda: status(run_id)["pid"], what="the job")
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: len(status(run_id)["attempts"]) == 2, timeout=30, what="the restart")
    first = status(run_id)["attempts"][0]
    assert first["signal"] == signal.SIGKILL and first["cause"] == "killed", first
    assert "kill -9" in " ".join(first["diagnosis"]["fixes"])
    tg("stop", run_id, "--grace", "1s")


def test_a_script_that_does_not_exist_is_bad_command_and_not_retried(tmp_path: Path, home: Path) -> None:
    done = tg("run", "--foreground", "--", sys.executable, str(tmp_path / "nosuchfile.py"))
    assert done.returncode == 78, done.stderr  # EX_CONFIG: fix the command first
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert run["state"] == "failed" and len(run["attempts"]) == 1
    assert run["attempts"][0]["cause"] == "bad_command"


def test_a_job_that_saved_and_left_on_an_outside_sigterm_is_preempted_and_resumed(tmp_path: Path, home: Path) -> None:
    """The README's pattern (`if ckpt.stop_requested: break`) exits 0 after a scheduler's SIGTERM: the
    run must not end `succeeded` at step 20 of 60."""
    job = script(tmp_path, "train.py", """
        import time
        from trainguard import Checkpointer
        ckpt = Checkpointer(every=None, every_steps=5, keep=2)
        state = ckpt.load_latest()
        start = state["step"] + 1 if state else 0
        print("starting at", start, flush=True)
        for step in range(start, 60):
            time.sleep(0.05)
            ckpt.maybe_save(step, lambda: {"step": step})
            if ckpt.stop_requested:
                print("saved and stopping at", step, flush=True)
                break
        else:
            print("finished", flush=True)
    """)  # fmt: skip
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    pid = wait_for(lambda: status(run_id)["pid"], what="the job")
    time.sleep(1.0)
    os.kill(pid, signal.SIGTERM)  # from outside trainguard: a scheduler, a cloud agent
    final = wait_for(lambda: (s := status(run_id))["state"] in ("succeeded", "failed") and s, timeout=60,
                     what="the run to end")  # fmt: skip
    first, second = final["attempts"][:2]
    assert first["exit_code"] == 0 and first["cause"] == "preempted", first
    out = tg("logs", run_id).stdout
    saved = int(out.split("saved and stopping at ")[1].split()[0])
    assert f"starting at {saved + 1}" in out and second["resumed_step"] == saved
    assert final["state"] == "succeeded" and "finished" in out


def test_a_death_that_only_hints_at_a_bug_is_restarted_once_before_the_run_ends(tmp_path: Path, home: Path) -> None:
    """A wrapper that exits 1 without a word when its worker died (a host OOM kill, a lost node) reads
    as python_error at low confidence: ending the run on that guess would throw the run away."""
    job = script(tmp_path, "train.py", """
        import os, sys
        attempt = int(os.environ["TRAINGUARD_ATTEMPT"])
        print("attempt", attempt, "step 1", flush=True)
        if attempt == 1 or os.environ.get("ALWAYS") == "1":
            sys.exit(1)
        print("finished", flush=True)
    """)  # fmt: skip
    done = tg("run", "--foreground", "--", sys.executable, job)
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(tg("ps", "--json").stdout)[0]
    first = run["attempts"][0]
    assert run["state"] == "succeeded" and len(run["attempts"]) == 2, run
    assert first["cause"] == "python_error" and first["confidence"] < 0.5, first
    assert "not sure enough to end the run; restarting once" in tg("logs", run["id"]).stdout

    again = tg("run", "--foreground", "--", sys.executable, job, env={**os.environ, "ALWAYS": "1"})
    assert again.returncode == 78, again.stderr[-2000:]  # the same guess twice: fix it first
    run = json.loads(tg("ps", "--json").stdout)[0]
    assert run["state"] == "failed" and len(run["attempts"]) == 2, run
    assert "python_error twice in a row" in again.stdout, again.stdout[-2000:]
