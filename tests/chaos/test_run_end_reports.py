"""What a run's end and its record tell a scheduler and a person, under real faults: a termination log
that cannot take the verdict (a FIFO nobody reads, a symbolic link), the reason of a stop signal from
outside trainguard, and the step of a job that ran on while nobody watched it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.conftest import supervisors_of
from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real


TICKER = """
    import time
    while True:
        print("step", flush=True)
        time.sleep(0.1)
"""


def _state(ref: str) -> str | None:
    """The run's state, None while it does not exist yet."""
    done = tg("status", ref, "--json")
    return json.loads(done.stdout)["state"] if done.returncode in (0, 1) else None


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "termination log" in line]


def test_a_fifo_with_no_reader_as_termination_log_is_refused_without_waiting(tmp_path: Path, home: Path) -> None:
    fifo = tmp_path / "termination-log"
    os.mkfifo(fifo)
    started = time.monotonic()
    done = tg("run", "--foreground", "--termination-log", str(fifo), "--", "true", timeout=60)
    assert time.monotonic() - started < 30, "the end waited on the FIFO"
    assert done.returncode == 0, done.stderr
    warning = _warnings(done.stderr)
    assert len(warning) == 1 and "warning" in warning[0] and "FIFO" in warning[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_fifo_with_a_reader_gets_nothing_and_a_symbolic_link_is_not_followed(tmp_path: Path, home: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # someone holds it open: an open would not wait
    try:
        done = tg("run", "--foreground", "--termination-log", str(fifo), "--", "true", timeout=60)
        assert done.returncode == 0 and len(_warnings(done.stderr)) == 1, done.stderr
        assert os.read(reader, 100) == b""  # nothing was written into it, and no writer holds it
    finally:
        os.close(reader)
    precious = tmp_path / "precious.txt"
    precious.write_text("kept\n")
    link = tmp_path / "link"
    link.symlink_to(precious)
    done = tg("run", "--foreground", "--termination-log", str(link), "--", "true", timeout=60,
              env={**os.environ, "LANG": "zh_CN.UTF-8"})  # fmt: skip
    assert done.returncode == 0 and "警告：无法写入终止日志" in done.stderr and "符号链接" in done.stderr
    assert precious.read_text() == "kept\n"


def test_an_outside_sigterm_reads_as_preempted_in_status_and_trainguard_stop_as_on_request(
    tmp_path: Path, home: Path
) -> None:
    ticker = script(tmp_path, "ticker.py", TICKER)
    log = tmp_path / "termination-log"
    foreground = subprocess.Popen(
        [sys.executable, "-m", "trainguard", "run", "--foreground", "--name", "outside", "--grace", "5s",
         "--termination-log", str(log), "--", sys.executable, ticker],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _state("outside") == "running", what="the job to run")
        foreground.send_signal(signal.SIGTERM)  # as the kubelet stops a pod's PID 1
        _, stderr = foreground.communicate(timeout=60)
    finally:
        if foreground.poll() is None:
            foreground.kill()
    assert foreground.returncode == 75, stderr
    info = status("outside")
    assert info["state"] == "stopped" and "preempted" in info["reason"] and "SIGTERM" in info["reason"]
    assert "stopped on request" not in info["reason"]
    assert "preempted" in tg("status", "outside").stdout.splitlines()[0]
    message = json.loads(log.read_text())
    assert message["cause"] == "preempted" and "preempted" in message["reason"]

    run_id = run_id_from(tg("run", "--name", "asked", "--", sys.executable, ticker).stdout)
    wait_for(lambda: status(run_id)["state"] == "running", what="the second job to run")
    assert tg("stop", run_id, "--grace", "5s").returncode == 0
    asked = wait_for(lambda: (s := status(run_id))["state"] == "stopped" and s, what="the stop")
    assert asked["reason"] == "stopped on request"


COUNTER = """
    import time
    from trainguard import progress
    step = 0
    while True:
        progress.report_step(step, force=True)
        print("step", step, flush=True)
        step += 1
        time.sleep(0.1)
"""


def test_status_shows_the_step_a_job_reached_after_its_supervisor_died(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "counter.py", COUNTER)
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    wait_for(lambda: (status(run_id)["attempts"][0]["step"] or 0) >= 5, what="a recorded step")
    supervisor = wait_for(lambda: (supervisors_of(run_id) or [None])[0], what="the supervisor")
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
    at_death = status(run_id)["attempts"][0]["step"]
    # The registry still holds the step of the supervisor's last record; the job has moved on.
    later = wait_for(lambda: (step := status(run_id)["attempts"][0]["step"]) >= at_death + 20 and step,
                     timeout=30, what="status to show the job's newer steps")  # fmt: skip
    assert later >= at_death + 20
    assert tg("stop", run_id, "--grace", "2s").returncode == 0
    stopped = status(run_id)
    assert stopped["state"] == "stopped" and stopped["attempts"][0]["step"] >= later  # the stop unwatched too


def test_status_says_how_old_a_running_jobs_step_report_is(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "quiet.py", """
        import json, os, time
        # a job whose last step report is ten minutes old (a long evaluation, or stuck)
        with open(os.environ["TRAINGUARD_PROGRESS_FILE"], "w") as out:
            json.dump({"step": 7, "step_time": time.time() - 600}, out)
        print("evaluating", flush=True)
        time.sleep(300)
    """)  # fmt: skip
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    wait_for(lambda: status(run_id)["attempts"][0]["step"] == 7, what="the step to be recorded")
    shown = tg("status", run_id).stdout
    attempt_line = next(line for line in shown.splitlines() if line.strip().startswith("attempt 1"))
    assert re.search(r"step 7 \(reported 10m\d\ds ago\)", attempt_line), shown
    zh = tg("status", run_id, env={**os.environ, "LANG": "zh_CN.UTF-8"}).stdout
    assert re.search(r"第 7 步（10m\d\ds前报告）", zh), zh
    assert tg("stop", run_id, "--grace", "1s").returncode == 0
