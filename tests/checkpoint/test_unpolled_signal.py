"""A stop signal nobody acts on is not swallowed (issue 19.6): a job that only calls
``Checkpointer.save()`` (never ``maybe_save``, never ``stop_requested``) ends by SIGTERM as it would
without trainguard, instead of running on until the scheduler's SIGKILL. A loop that asks keeps its
save on SIGTERM. Real processes and real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real

SAVES_ONLY = """
    import sys, time
    from trainguard import Checkpointer
    ckpt = Checkpointer(sys.argv[1], every=None)
    for step in range(100_000):
        if step % 10 == 0:
            ckpt.save({"step": step}, step)
        print("step", step, flush=True)
        time.sleep(0.05)
"""

ASKS = """
    import sys, time
    from trainguard import Checkpointer
    ckpt = Checkpointer(sys.argv[1], every=None)
    for step in range(100_000):
        print("step", step, flush=True)
        ckpt.maybe_save(step, {"step": step})
        if ckpt.stop_requested:
            print("saved and stopped at", step, flush=True)
            break
        time.sleep(0.05)
"""


def _start(tmp_path: Path, body: str) -> subprocess.Popen:
    job = subprocess.Popen([sys.executable, script(tmp_path, "job.py", body), str(tmp_path / "ckpt")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    for line in job.stdout:
        if line.startswith("step 5"):
            return job
    raise AssertionError(job.stderr.read())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_job_that_never_asks_ends_by_the_stop_signal(tmp_path: Path, signum: signal.Signals) -> None:
    job = _start(tmp_path, SAVES_ONLY)
    job.send_signal(signum)
    try:
        returncode = job.wait(timeout=10)  # before: it trained on, signal swallowed
    finally:
        job.kill()
    assert returncode == -signum
    assert "arrived before the training loop ever asked for one" in job.stderr.read()


def test_a_loop_that_asks_still_saves_on_sigterm(tmp_path: Path) -> None:
    job = _start(tmp_path, ASKS)
    job.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 0
    assert "saved and stopped at" in job.stdout.read()


def test_a_handler_the_job_had_before_still_decides(tmp_path: Path) -> None:
    handler = '    import signal\n    signal.signal(signal.SIGTERM, lambda *a: print("its own handler", flush=True))\n'
    body = handler + SAVES_ONLY
    job = _start(tmp_path, body)
    job.send_signal(signal.SIGTERM)
    time.sleep(1)
    try:
        assert job.poll() is None  # the job's own handler chose to go on
    finally:
        job.kill()
    assert "its own handler" in job.stdout.read()


def test_trainguard_stop_of_a_job_that_only_saves_does_not_wait_the_grace_out(tmp_path: Path) -> None:
    job = script(tmp_path, "job.py", SAVES_ONLY)
    started = tg("run", "--max-restarts", "0", "--", sys.executable, job, str(tmp_path / "ckpt"))
    run_id = run_id_from(started.stdout)
    wait_for(lambda: "step 5" in tg("logs", run_id).stdout, timeout=60, what="five steps")
    began = time.monotonic()
    stopped = tg("stop", run_id, "--grace", "15s")
    took = time.monotonic() - began
    assert stopped.returncode == 0, stopped.stderr
    assert took < 10, f"stop took {took:.1f} s: the grace ran out and the job was SIGKILLed"  # before: 15 s
    assert status(run_id)["state"] == "stopped"
