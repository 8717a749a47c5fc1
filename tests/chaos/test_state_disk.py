"""A full, read-only or removed state disk does not kill supervision, and no command prints a
traceback: the supervisor keeps watching, restarting and stopping the job from what it keeps in
memory and writes the registry when it can again."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.conftest import alive, env_with_hook, sleeping_jobs, supervisors_of
from tests.real import faults
from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real

# Prints a lot (it fills a small state disk with its log) and tells the test, outside the state
# disk, which attempt it is in.
CHATTY = """
    import os, sys, time
    beacon = sys.argv[1]
    attempt = os.environ["TRAINGUARD_ATTEMPT"]
    while True:
        with open(beacon + ".tmp", "w") as out:
            out.write(f"{attempt} {os.getpid()}")
        os.replace(beacon + ".tmp", beacon)  # the test never reads half a line
        try:
            print("x" * 4000, flush=True)
        except OSError:
            pass
        time.sleep(0.01)
"""


def _fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


def _one_line(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") <= 1, done.stderr


def test_a_full_state_disk_does_not_stop_supervision(tmp_path: Path, monkeypatch) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    with faults.small_tmpfs(tmp_path / "state", "2m") as home:
        monkeypatch.setenv("TRAINGUARD_HOME", str(home))
        beacon = tmp_path / "beacon"
        run_id = run_id_from(tg("run", "--", sys.executable, script(tmp_path, "chatty.py", CHATTY), str(beacon)).stdout)
        wait_for(lambda: beacon.exists() and beacon.read_text().startswith("1 "), what="attempt 1")
        filler = _fill(home)
        time.sleep(1.0)
        assert shutil.disk_usage(home).free < 64 * 1024

        # The job dies while nothing can be written: the supervisor still restarts it.
        first_pid = int(beacon.read_text().split()[1])
        os.kill(first_pid, signal.SIGKILL)
        wait_for(lambda: beacon.read_text().startswith("2 "), timeout=30, what="attempt 2 on a full disk")

        for command in (["ps"], ["status", run_id], ["logs", run_id, "--attempt", "1"], ["diagnose", run_id]):
            _one_line(tg(*command))
        refused = tg("run", "--", "true")
        assert refused.returncode == 2
        _one_line(refused)
        assert len(list((home / "runs").iterdir())) == 1, "a refused run left a folder behind"

        # Room again: what the supervisor kept in memory reaches the registry.
        filler.unlink()
        wait_for(lambda: len(status(run_id)["attempts"]) == 2, timeout=15, what="the registry to catch up")
        stopped = tg("stop", run_id, "--grace", "2s")
        assert stopped.returncode == 0, stopped.stderr
        assert status(run_id)["state"] == "stopped"


def test_stop_works_on_a_full_state_disk(tmp_path: Path, monkeypatch) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    with faults.small_tmpfs(tmp_path / "state", "2m") as home:
        monkeypatch.setenv("TRAINGUARD_HOME", str(home))
        beacon = tmp_path / "beacon"
        run_id = run_id_from(tg("run", "--", sys.executable, script(tmp_path, "chatty.py", CHATTY), str(beacon)).stdout)
        wait_for(beacon.exists, what="the job")
        pid = int(beacon.read_text().split()[1])
        _fill(home)
        stopped = tg("stop", run_id, "--grace", "2s", "--no-wait")
        assert stopped.returncode == 0
        _one_line(stopped)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=15, what="the job to be stopped")


# The state disk fills the moment the supervisor goes to record its job (the hook picks the moment;
# the disk is a real tmpfs, and full).
FILL_AS_THE_JOB_IS_RECORDED = """
import contextlib, os
from trainguard.store.journal import Journal

record = Journal.start_attempt

def fill_then_record(self, attempt):
    with contextlib.suppress(OSError):  # a reserve already spent: the record has no room at all
        os.unlink(os.path.join(os.environ["TRAINGUARD_HOME"], "reserve"))
    with open(os.environ["FILLER"], "wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(bytes(65536))
            out.flush()
    record(self, attempt)

Journal.start_attempt = fill_then_record
"""


def test_stop_ends_a_job_its_record_does_not_know(tmp_path: Path, monkeypatch) -> None:
    """A job started while the state disk is full is recorded only in its supervisor's memory (it
    starts all the same: supervision never waits on the state disk); with that supervisor killed,
    `stop` answered "nothing was running" and the job ran on. `stop` ends every process of the run,
    recorded or not."""
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    with faults.small_tmpfs(tmp_path / "state", "2m") as home:
        monkeypatch.setenv("TRAINGUARD_HOME", str(home))
        filler = home / "filler"
        env = env_with_hook(tmp_path, FILL_AS_THE_JOB_IS_RECORDED, FILLER=str(filler))
        started = tg("run", "--name", "full", "--", "sleep", "300", env=env)
        assert started.returncode == 0, started.stderr
        [supervisor] = supervisors_of(status("full")["id"])
        os.kill(supervisor, signal.SIGKILL)
        filler.unlink()
        [job] = sleeping_jobs(home)
        assert status("full")["pid"] is None  # what the record knows
        stopped = tg("stop", "full", "--grace", "2s")
        assert stopped.returncode == 0, stopped.stderr
        wait_for(lambda: not alive(job), timeout=15, what="the unrecorded job to be stopped (it ran on)")
        assert "did not know" in stopped.stdout, stopped.stdout


def test_a_run_that_ends_on_a_full_state_disk_is_recorded_once_there_is_room(tmp_path: Path, monkeypatch) -> None:
    """The supervisor's last records (the attempt's end, the verdict) are their only copy: it waits for
    room instead of leaving with them, which left the run 'running' for good."""
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    with faults.small_tmpfs(tmp_path / "state", "2m") as home:
        monkeypatch.setenv("TRAINGUARD_HOME", str(home))
        beacon = tmp_path / "beacon"
        job = script(tmp_path, "dies.py", f"""
            import pathlib, sys, time
            pathlib.Path({str(beacon)!r}).write_text("up")
            while not pathlib.Path({str(beacon)!r} + ".go").exists():
                time.sleep(0.05)
            sys.exit(3)
        """)
        foreground = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--foreground", "--name", "f",
                                       "--restart", "never", "--", sys.executable, job],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            wait_for(beacon.exists, what="the job")
            filler = _fill(home)
            Path(str(beacon) + ".go").write_text("")  # the job dies while nothing can be written
            time.sleep(3)
            assert foreground.poll() is None, "the supervisor left with the run's end unwritten"
            filler.unlink()
            assert foreground.wait(timeout=30) != 0
        finally:
            foreground.kill()
        final = status("f")
        assert final["state"] == "failed", final
        assert final["attempts"][0]["exit_code"] == 3
        said = foreground.stderr.read()
        assert "waits and writes them" in said and "can be written again" in said, said


def test_a_read_only_registry_is_a_one_line_error(tmp_path: Path, monkeypatch) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"a tmpfs remounted read-only: {reason}")
    with faults.small_tmpfs(tmp_path / "state", "8m") as home:
        monkeypatch.setenv("TRAINGUARD_HOME", str(home))
        assert tg("run", "--foreground", "--", "true").returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)
        for command in (["ps"], ["run", "--", "true"], ["status", "nosuch"]):
            done = tg(*command)
            _one_line(done)
            assert done.returncode in (0, 2), done.stderr
        assert tg("run", "--", "true").returncode == 2


def test_a_deleted_log_does_not_crash_the_supervisor_and_commands_say_so(tmp_path: Path, home: Path) -> None:
    job = script(tmp_path, "late_bug.py", """
        import sys, time
        for step in range(30):
            print("step", step, flush=True)
            time.sleep(0.1)
        raise KeyError("bird")
    """)  # fmt: skip
    run_id = run_id_from(tg("run", "--", sys.executable, job).stdout)
    run_dir = home / "runs" / run_id
    wait_for(lambda: b"step 3" in (run_dir / "attempt-1.log").read_bytes(), what="output")
    (run_dir / "output.log").unlink()
    (run_dir / "attempt-1.log").unlink()
    wait_for(lambda: status(run_id)["state"] == "failed", timeout=30, what="the run to end")
    info = status(run_id)
    assert info["supervisor"] == "exited"
    assert info["attempts"][0]["cause"] == "python_error"  # read from the log through the supervisor's open file
    for command in (["logs", run_id], ["diagnose", run_id]):
        done = tg(*command)
        assert done.returncode == 2 and "no longer exists" in done.stderr
        _one_line(done)


def test_a_state_folder_removed_under_a_running_run_is_recreated(tmp_path: Path, home: Path) -> None:
    run_id = run_id_from(tg("run", "--name", "survivor", "--", "sleep", "300").stdout)
    shutil.rmtree(home)
    wait_for(lambda: (home / "runs.sqlite").exists() and tg("status", run_id).returncode == 0, timeout=15,
             what="the registry to be recreated")  # fmt: skip
    info = status(run_id)
    assert info["state"] == "running" and info["supervisor"] == "alive"
    assert tg("stop", "survivor", "--grace", "1s").returncode == 0
    assert status(run_id)["state"] == "stopped"


def test_a_stop_request_nobody_acted_on_does_not_block_later_stops(tmp_path: Path, home: Path) -> None:
    run_id = run_id_from(tg("run", "--name", "stale", "--", "sleep", "300").stdout)
    with sqlite3.connect(home / "runs.sqlite") as db:  # a stop whose signal was lost with its supervisor
        db.execute('UPDATE runs SET stop_request = \'{"time": 0, "grace_s": 1}\' WHERE id = ?', (run_id,))
    supervisor = json_pid(home, run_id)
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
    assert tg("adopt", run_id).returncode == 0
    stopped = tg("stop", run_id, "--grace", "1s")
    assert stopped.returncode == 0, stopped.stderr
    assert status(run_id)["state"] == "stopped"


def json_pid(home: Path, run_id: str) -> int:
    with sqlite3.connect(home / "runs.sqlite") as db:
        return db.execute("SELECT supervisor_pid FROM runs WHERE id = ?", (run_id,)).fetchone()[0]


def test_the_state_folder_and_its_files_are_private(tmp_path: Path, home: Path) -> None:
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)  # an existing folder others can read
    done = tg("run", "--foreground", "--notify", "slack=https://hooks.slack.com/services/T/B/SECRETTOKEN", "--",
              "true")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert home.stat().st_mode & 0o777 == 0o700
    for path in home.rglob("*"):
        if path.is_symlink():
            continue
        mode = path.stat().st_mode & 0o777
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    if os.geteuid() == 0:
        as_nobody = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                                    "-c", f"open({str(home / 'runs.sqlite-wal')!r}).read()"], capture_output=True,
                                   check=False)  # fmt: skip
        assert as_nobody.returncode != 0


def test_run_references_are_names_ids_or_unique_prefixes_never_wildcards(home: Path) -> None:
    first = tg("run", "--foreground", "--name", "alpha", "--", "true")
    assert first.returncode == 0
    for wildcard in ("%", "_", "*"):
        done = tg("status", wildcard)
        assert done.returncode == 2 and "no run" in done.stderr
    run_id = json_ids(home)[0]
    assert tg("status", run_id[:3]).returncode == 0
    from trainguard.store.registry import Registry

    more = Registry(home)
    for _ in range(40):  # enough runs that two ids share a first character (ids as `run` makes them)
        more.set_state(more.create_run(["true"], name=None, cwd="/", options={}).id, "succeeded")
    ids = json_ids(home)
    shared = next(i[0] for i in ids if sum(j[0] == i[0] for j in ids) > 1)
    ambiguous = tg("status", shared)
    assert ambiguous.returncode == 2 and "several run ids" in ambiguous.stderr


def json_ids(home: Path) -> list[str]:
    with sqlite3.connect(home / "runs.sqlite") as db:
        return [row[0] for row in db.execute("SELECT id FROM runs ORDER BY created_at")]


def test_a_second_registry_in_one_process_never_loses_the_first_ones_writes(tmp_path: Path) -> None:
    """`run --name X --foreground` opens the registry twice in one process. Closing any descriptor
    of the database drops every POSIX lock the process holds on it (SQLite's own warning): another
    command that then opened and closed the registry took itself for the last user and deleted the
    WAL the supervisor was still writing into; its attempt and state never reached the disk and
    `status` showed a run starting forever (CI saw it as a test waiting 90 s)."""
    from trainguard.store.registry import Attempt, Registry

    state = tmp_path / "state"
    first = Registry(state)
    run = first.create_run(["sleep", "1"], name="z", cwd="/", options={})
    Registry(state).get(run.id)  # the second one, in this process
    other = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from trainguard.store.registry import Registry; Registry(Path(sys.argv[1])).all()",
                            str(state)], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert other.returncode == 0, other.stderr
    first.start_attempt(run.id, Attempt(n=1, started_at=time.time(), pid=12345))
    first.set_state(run.id, "failed")
    with contextlib.closing(sqlite3.connect(state / "runs.sqlite")) as reader:  # what any other command reads
        assert reader.execute("SELECT state, job_pid FROM runs").fetchall() == [("failed", 12345)]
        assert reader.execute("SELECT n FROM attempts").fetchall() == [(1,)]


def test_a_registry_another_process_is_creating_is_waited_for_not_refused(tmp_path: Path) -> None:
    """Two commands opening a new registry together: one writes it (still in rollback-journal mode)
    while the other switches it to WAL and makes its tables, statements that take their write lock
    inside a read and so were refused at once ("database is locked", exit 2) instead of waiting."""
    state = tmp_path / "state"
    state.mkdir()
    with contextlib.closing(sqlite3.connect(state / "runs.sqlite", isolation_level=None)) as writer:
        writer.execute("CREATE TABLE unrelated (x)")
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO unrelated VALUES (1)")
        opener = subprocess.Popen([sys.executable, "-m", "trainguard", "ps"], env={**os.environ, "TRAINGUARD_HOME": str(state)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(1.5)
        writer.execute("COMMIT")
    _, said = opener.communicate(timeout=60)
    assert opener.returncode == 0, said
