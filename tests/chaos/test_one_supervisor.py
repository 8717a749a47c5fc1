"""Exactly one supervisor per run, and liveness that is true: concurrent adopts, a zombie supervisor,
a recorded pid taken by another process, `stop` of a run whose supervisor is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.conftest import alive, env_with_hook, sleeping_jobs, supervisors_of
from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real


def supervisor_pid(run_id: str) -> int:
    return wait_for(lambda: (supervisors_of(run_id) or [None])[0], what="the supervisor")


def test_six_concurrent_adopts_leave_one_supervisor_one_job_and_a_consistent_run(home: Path) -> None:
    run_id = run_id_from(tg("run", "--name", "x", "--", "sleep", "300").stdout)
    os.kill(supervisor_pid(run_id), signal.SIGKILL)
    wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
    adopts = [subprocess.Popen([sys.executable, "-m", "trainguard", "adopt", "x"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(6)]  # fmt: skip
    results = [(p.wait(60), p.stderr.read()) for p in adopts]
    assert sorted(code for code, _ in results) == [0, 2, 2, 2, 2, 2], results
    for code, err in results:
        if code == 2:
            assert "already watched by supervisor" in err and err.count("\n") == 1
    assert len(supervisors_of(run_id)) == 1

    job = status(run_id)["pid"]
    os.kill(job, signal.SIGKILL)
    wait_for(lambda: len(status(run_id)["attempts"]) == 2 and status(run_id)["state"] == "running",
             what="the one restart")  # fmt: skip
    time.sleep(1.5)  # room for a second (wrong) restart to show up
    info = status(run_id)
    assert [a["n"] for a in info["attempts"]] == [1, 2]
    assert len(supervisors_of(run_id)) == 1
    assert tg("stop", run_id, "--grace", "2s").returncode == 0
    time.sleep(1.0)
    final = status(run_id)
    assert final["state"] == "stopped" and [a["n"] for a in final["attempts"]] == [1, 2]
    assert not alive(info["pid"])
    assert supervisors_of(run_id) == []


def test_a_zombie_supervisor_is_gone_at_once(tmp_path: Path, home: Path) -> None:
    """A supervisor killed under a parent that has not reaped it yet is a zombie: it watches nothing."""
    said = (tmp_path / "foreground.out").open("w+")
    foreground = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--name", "z", "--foreground", "--",
                                   "sleep", "300"], stdout=said, stderr=subprocess.STDOUT)  # fmt: skip
    try:

        def started() -> dict | None:
            if foreground.poll() is not None:  # it will never start: say what it said
                said.seek(0)
                raise AssertionError(f"run --foreground exited {foreground.returncode}: {said.read()}")
            return _running("z")

        run = wait_for(started, timeout=90, what="the run to start")
        os.kill(foreground.pid, signal.SIGKILL)
        wait_for(lambda: Path(f"/proc/{foreground.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
                 what="a zombie")  # fmt: skip
        assert status(run["id"])["supervisor"] == "gone"  # not reaped, and still not alive
        adopted = tg("adopt", "z")
        assert adopted.returncode == 0, adopted.stderr
        assert status(run["id"])["supervisor"] == "alive"
    finally:
        foreground.wait()
        said.close()


def _running(name: str) -> dict | None:
    listed = tg("status", name, "--json")
    if listed.returncode != 0:
        return None
    info = json.loads(listed.stdout)
    return info if info["state"] == "running" and info["pid"] else None


def test_stop_never_signals_a_process_that_took_a_recorded_pid(tmp_path: Path, home: Path, cleanup_pids) -> None:
    """The job's pid is reused by an unrelated process after the job and its supervisor died: `stop`
    must leave that process alone (a pid is an identity only with its start time)."""
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("choosing the next pid needs a writable /proc/sys/kernel/ns_last_pid (root)")
    run_id = run_id_from(tg("run", "--name", "reuse", "--", "sleep", "300").stdout)
    job = status(run_id)["pid"]
    os.kill(supervisor_pid(run_id), signal.SIGKILL)
    wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
    os.kill(job, signal.SIGKILL)
    try:
        wait_for(lambda: not Path(f"/proc/{job}").exists(), timeout=10, what="the job's pid to be free")
    except AssertionError:
        pytest.skip("nobody reaped the dead job: its pid is not free")
    stranger = None
    for _ in range(20):  # another process may take the pid first; try again
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(job - 1))
        candidate = subprocess.Popen(["sleep", "300"], start_new_session=True)
        cleanup_pids.append(candidate.pid)
        if candidate.pid == job:
            stranger = candidate
            break
    if stranger is None:
        pytest.skip("could not make a new process take the dead job's pid")
    stopped = tg("stop", "reuse", "--grace", "1s")
    assert stopped.returncode == 0, stopped.stderr
    assert stranger.poll() is None, "stop killed a process that only had the job's old pid"
    assert status(run_id)["state"] == "stopped"


def test_stop_without_a_supervisor_gives_the_grace_then_kills_and_says_so(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "stubborn.py", """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.1)
    """)  # fmt: skip
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    pid = status(run_id)["pid"]
    os.kill(supervisor_pid(run_id), signal.SIGKILL)
    wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
    started = time.monotonic()
    stopped = tg("stop", run_id, "--grace", "2s")
    took = time.monotonic() - started
    assert stopped.returncode == 0, stopped.stderr
    assert took >= 2.0, f"stopped in {took:.2f} s: the grace period was not given"
    assert "did not end within the 2 s grace period and was killed" in stopped.stdout
    assert not alive(pid)
    assert status(run_id)["state"] == "stopped"


def test_a_second_run_with_the_name_of_a_live_run_is_refused(home: Path) -> None:
    run_id = run_id_from(tg("run", "--name", "vit", "--", "sleep", "300").stdout)
    again = tg("run", "--name", "vit", "--", "sleep", "1")
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert "already watched by supervisor" in again.stderr and run_id in again.stderr
    assert len(json_ps()) == 1


def json_ps() -> list[dict]:
    import json

    return json.loads(tg("ps", "--json").stdout)


# Creates a run the way `trainguard run --name w` does, and waits for a line before starting its
# supervisor: the moment every other command meets a run that is starting and not yet watched.
SLOW_STARTER = """
import signal, sys
from trainguard.supervisor import service

signal.signal(signal.SIGTERM, lambda *_: None)  # as `run` does while it holds the lock for its supervisor
registry, record, lock = service.create_run(["sleep", "300"], name="w", options={})
print(record.id, flush=True)
sys.stdin.readline()
started = service.start_detached(registry, record, lock=lock)
print(started.state, flush=True)
"""


def test_a_run_still_starting_is_never_taken_for_one_whose_supervisor_died(tmp_path: Path, home: Path) -> None:
    """Between the record of a new run and its supervisor, `run --name`, `adopt` and `stop` found a run
    with nobody holding its lock: they adopted it (two supervisors, a record deleted under a live job)
    or stopped it unwatched (the job started anyway, unrecorded). The creator holds the lock from
    before the record is visible and hands it to the supervisor."""
    starter = subprocess.Popen([sys.executable, "-c", SLOW_STARTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        run_id = starter.stdout.readline().strip()
        assert run_id, "the starter did not create its run"
        again = tg("run", "--name", "w", "--", "sleep", "300")
        assert again.returncode == 2 and "already watched" in again.stderr, again.stdout + again.stderr
        adopted = tg("adopt", "w")
        assert adopted.returncode == 2 and "already watched" in adopted.stderr, adopted.stdout + adopted.stderr
        stopped = tg("stop", "w", "--no-wait")
        assert stopped.returncode == 0, stopped.stderr
        starter.stdin.write("go\n")
        starter.stdin.flush()
        assert starter.stdout.readline().strip() == "stopped"
    finally:
        starter.kill()
        starter.wait()
    final = status(run_id)
    assert final["state"] == "stopped" and final["attempts"] == [], final
    assert [run["id"] for run in json.loads(tg("ps", "--json").stdout)] == [run_id]
    assert supervisors_of(run_id) == []



# Put on PYTHONPATH, it holds every supervisor of the test at one moment, HOLD_AT: between starting
# its job and recording it ("record": the registry write never returns), or after recording it and
# before answering the command that started it ("answer"); it tells the test its pid, so that a kill
# lands in that gap each time.
HOLD_SUPERVISOR = """
import os, time
from trainguard.store.journal import Journal
from trainguard.supervisor.service import Handshake

def held(*args, **kwargs):
    with open(os.environ["HELD_SUPERVISOR_FILE"] + ".part", "w") as out:
        out.write(str(os.getpid()))
    os.rename(os.environ["HELD_SUPERVISOR_FILE"] + ".part", os.environ["HELD_SUPERVISOR_FILE"])
    time.sleep(3600)

if os.environ["HOLD_AT"] == "record":
    Journal.start_attempt = held
else:
    Handshake.started = held
"""


def _tg_killing_the_supervisor(
    tmp_path: Path, *args: str, at: str = "record", while_held: Callable[[], None] = lambda: None
) -> subprocess.CompletedProcess:
    """``trainguard *args``, whose supervisor is SIGKILLed held at ``at`` (see HOLD_SUPERVISOR);
    ``while_held`` runs before the kill."""
    held = tmp_path / "held-supervisor"
    held.unlink(missing_ok=True)
    env = env_with_hook(tmp_path, HOLD_SUPERVISOR, HELD_SUPERVISOR_FILE=str(held), HOLD_AT=at)
    command = subprocess.Popen([sys.executable, "-m", "trainguard", *args], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for(held.exists, what="the supervisor to reach the moment it is held at")
        while_held()
        os.kill(int(held.read_text()), signal.SIGKILL)
        stdout, stderr = command.communicate(timeout=60)
    finally:
        command.kill()
    return subprocess.CompletedProcess(command.args, command.returncode, stdout, stderr)


def test_a_supervisor_killed_as_it_starts_the_job_leaves_no_job_behind(tmp_path: Path, home: Path) -> None:
    """Killed between starting the job and recording it, the supervisor left a job nobody knew of:
    `run` reported the failed start and forgot the run, and nothing could stop the job any more."""
    started = _tg_killing_the_supervisor(tmp_path, "run", "--name", "k", "--", "sleep", "300")
    assert started.returncode != 0, started.stdout
    assert "exited while starting" in started.stderr and started.stderr.count("\n") == 1, started.stderr
    wait_for(lambda: sleeping_jobs(home) == [], timeout=5, what="the unrecorded job to go (it was left running)")
    assert json.loads(tg("ps", "--json").stdout) == []


def test_a_supervisor_killed_after_recording_the_job_leaves_a_run_that_knows_it(tmp_path: Path, home: Path) -> None:
    """Killed after the job is recorded and before `run` is answered: `run` says so and how to go
    on; the job is the run's, `adopt` watches it again and `stop` ends it."""
    started = _tg_killing_the_supervisor(tmp_path, "run", "--name", "k", "--", "sleep", "300", at="answer")
    assert started.returncode != 0 and "trainguard adopt" in started.stderr, started.stderr
    [job] = sleeping_jobs(home)
    assert status("k")["pid"] == job
    assert tg("adopt", "k").returncode == 0
    assert tg("stop", "k", "--grace", "1s").returncode == 0
    wait_for(lambda: sleeping_jobs(home) == [], timeout=10, what="the job to end with its run")
    assert status("k")["state"] == "stopped"


def test_a_supervisor_killed_after_its_short_job_ended_says_the_job_is_not_running(tmp_path: Path) -> None:
    """Killed before answering, after a job that ends at once: `run` must not say the job runs on."""
    started = _tg_killing_the_supervisor(tmp_path, "run", "--name", "q", "--restart", "never", "--", "true",
                                         at="answer", while_held=lambda: time.sleep(1.0))  # fmt: skip
    assert started.returncode != 0 and "which is not running" in started.stderr, started.stderr
    assert tg("adopt", "q").returncode == 0
    wait_for(lambda: status("q")["state"] not in ("running", "starting"), what="the adopted run to end")
    assert len(status("q")["attempts"]) == 1


def test_the_job_never_runs_before_its_supervisor_has_recorded_it(tmp_path: Path, home: Path) -> None:
    """Its command runs only once its attempt is in the registry: a supervisor killed before that
    leaves nothing that ran (the job ran at once, unrecorded, and only a search of every process's
    environment could find it; one still between fork and exec escaped that too: CI's failure)."""
    marker = tmp_path / "ran"

    def before_the_kill() -> None:
        time.sleep(1.0)
        assert not marker.exists(), "the job ran before it was recorded"

    started = _tg_killing_the_supervisor(
        tmp_path, "run", "--", "sh", "-c", f"touch {marker}; sleep 300", while_held=before_the_kill
    )
    assert started.returncode != 0
    wait_for(lambda: sleeping_jobs(home) == [], timeout=5, what="the unrecorded job to go")
    time.sleep(0.5)
    assert not marker.exists()


def test_the_job_does_not_inherit_the_supervisors_deafness_to_sighup(tmp_path: Path, home: Path) -> None:
    """The supervisor ignores SIGHUP; a job it started inherited that (SIG_IGN survives exec), so a job
    that reloads or stops on SIGHUP could not be told."""
    marker = tmp_path / "sigign"
    job = script(tmp_path, "job.py", f"""
        import pathlib, time
        status = pathlib.Path("/proc/self/status").read_text()
        pathlib.Path({str(marker)!r}).write_text(status.split("SigIgn:")[1].split()[0])
        time.sleep(300)
    """)
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    wait_for(marker.exists, what="the job")
    assert int(marker.read_text(), 16) & 1 == 0, f"SIGHUP ignored in the job (SigIgn {marker.read_text()})"
    assert tg("stop", run_id, "--grace", "1s").returncode == 0


def test_a_continuation_that_fails_to_start_leaves_the_run_as_it_was(tmp_path: Path, home: Path) -> None:
    """`restart` marks the run starting under its lock before its supervisor starts; a supervisor
    killed as it starts the job must leave the run ended as before, not 'starting' with nobody."""
    run_id = run_id_from(tg("run", "--name", "k", "--", "sleep", "300").stdout)
    assert tg("stop", run_id, "--grace", "1s").returncode == 0
    continued = _tg_killing_the_supervisor(tmp_path, "restart", "k")
    assert continued.returncode != 0, continued.stdout
    final = status(run_id)
    assert final["state"] == "stopped" and len(final["attempts"]) == 1, final
    wait_for(lambda: sleeping_jobs(home) == [], timeout=5, what="the unrecorded job to go (it was left running)")
    assert tg("restart", "k").returncode == 0  # and it can be continued again
    assert tg("stop", run_id, "--grace", "1s").returncode == 0
