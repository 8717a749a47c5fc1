"""A job that floods its log, or fills the state disk itself, never wedges its run. Seen before the
log bound: on a 64 MB state disk a job writing ~20 MB/s died of ENOSPC, `ps` said "running" for
minutes, `stop` ran 2 min 30 s, and the end was recorded 4.5 min late as "stopped on request".

Here the state folder is a real 64 MB tmpfs (where a range cannot be collapsed, so logs are cut by
copy-then-truncate) and the jobs write for real."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import time
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest

from tests.real import faults
from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real

# ~20 MB/s of numbered lines for a while, then its last line; the end time goes outside the state disk.
FLOOD = """
    import sys, time
    seconds, stamp = float(sys.argv[1]), sys.argv[2]
    started, n = time.time(), 0
    while time.time() - started < seconds:
        sys.stdout.write("".join(f"line {n + i} " + "x" * 90 + "\\n" for i in range(2000)))
        sys.stdout.flush()
        n += 2000
        time.sleep(0.01)
    print(f"DONE {n}", flush=True)
    open(stamp, "w").write(str(time.time()))
"""

# Fills the disk it is given (the state folder's, as a $HOME holding both does) until ENOSPC.
FILL_THE_DISK = """
    import sys, time, traceback
    target, stamp = sys.argv[1], sys.argv[2]
    print("writing the dataset cache", flush=True)
    try:
        with open(target, "wb") as out:
            while True:
                out.write(b"\\0" * (1 << 20))
                out.flush()
    except OSError:
        traceback.print_exc()
        open(stamp, "w").write(str(time.time()))
        sys.exit(1)
"""


@pytest.fixture
def state_disk(tmp_path: Path, monkeypatch) -> Path:
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    with faults.small_tmpfs(tmp_path / "state", "64m") as home:
        monkeypatch.setenv("TRAINGUARD_HOME", str(home))
        yield home


def _ended(record: dict) -> float:
    """When the run's last attempt ended, as recorded (to the second)."""
    return datetime.fromisoformat(record["attempts"][-1]["ended_at"]).timestamp()


def _run_folder(home: Path, run_id: str) -> Path:
    return home / "runs" / run_id


def test_a_flooding_job_runs_to_its_end_within_the_log_bound(tmp_path: Path, state_disk: Path) -> None:
    stamp = tmp_path / "ended"
    job = script(tmp_path, "flood.py", FLOOD)
    run_id = run_id_from(tg("run", "--restart", "never", "--", sys.executable, job, "25", str(stamp)).stdout)
    least_free, deadline = shutil.disk_usage(state_disk).free, time.monotonic() + 90
    while not stamp.exists():
        least_free = min(least_free, shutil.disk_usage(state_disk).free)
        assert time.monotonic() < deadline, f"the job did not end: {status(run_id)['state']}"
        time.sleep(0.1)
    final = wait_for(lambda: (s := status(run_id))["state"] == "succeeded" and s, timeout=10,
                     what="the run's end recorded")  # fmt: skip
    ended_late = _ended(final) - float(stamp.read_text())
    assert ended_late < 3, f"the end was recorded {ended_late:.1f} s after the job's"
    assert least_free > 1 << 20, f"the state disk came down to {least_free} bytes free"

    shown = tg("logs", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    output = [line for line in lines if not line.startswith("====")]
    assert output[0].startswith("line 0 "), output[:2]  # the head: how the attempt began
    assert output[-1].startswith("DONE "), output[-2:]  # the newest: how it ended
    dropped = [line for line in lines if "output dropped here" in line]
    assert len(dropped) == 1, dropped
    numbers = [int(line.split()[1]) for line in output if line.startswith("line ") and line.endswith("x" * 90)]
    jumps = [(a, b) for a, b in pairwise(numbers) if b != a + 1]
    assert len(jumps) == 1, f"the kept output has holes besides the one marked: {jumps[:5]}"
    assert numbers[-1] + 1 == int(output[-1].split()[1]), "the newest lines are not the last ones written"
    with sqlite3.connect(state_disk / "runs.sqlite") as db:
        said = db.execute("SELECT data FROM events WHERE run_id = ? AND kind = 'log_disk_pressure'",
                          (run_id,)).fetchall()  # fmt: skip
    assert len(said) == 1, said  # the nearly full disk is said once, not each rotation
    diagnosed = tg("diagnose", run_id)
    assert diagnosed.returncode in (0, 1) and "Traceback" not in diagnosed.stderr


def test_a_log_bound_a_person_chose_is_kept(tmp_path: Path, state_disk: Path) -> None:
    stamp = tmp_path / "ended"
    job = script(tmp_path, "flood.py", FLOOD)
    run_id = run_id_from(tg("run", "--restart", "never", "--log-max-size", "2M", "--log-backups", "1", "--",
                            sys.executable, job, "6", str(stamp)).stdout)  # fmt: skip
    wait_for(stamp.exists, timeout=60, what="the job's end")
    wait_for(lambda: status(run_id)["state"] == "succeeded", timeout=10, what="the run's end recorded")
    folder = _run_folder(state_disk, run_id)
    kept = sorted(path.name for path in folder.glob("attempt-1*") if path.is_file())
    assert kept == ["attempt-1.head.log", "attempt-1.kept.json", "attempt-1.log", "attempt-1.log.1"], kept
    # Each piece holds at most its size plus one tick (a second) of this job's ~20 MB/s.
    assert (folder / "attempt-1.head.log").stat().st_size <= 1 << 20
    assert (folder / "attempt-1.log.1").stat().st_size <= (2 << 20) + (40 << 20)
    record = json.loads((folder / "attempt-1.kept.json").read_text())
    assert record["rotations"] >= 2 and record["dropped_bytes"] > 0, record
    refused = tg("run", "--log-max-size", "10k", "--", "true")
    assert refused.returncode == 2 and "--log-max-size" in refused.stderr and "Traceback" not in refused.stderr


def test_a_job_that_fills_the_state_disk_itself_ends_disk_full_at_its_true_end(tmp_path: Path,
                                                                             state_disk: Path) -> None:  # fmt: skip
    stamp = tmp_path / "died"
    job = script(tmp_path, "fill.py", FILL_THE_DISK)
    run_id = run_id_from(tg("run", "--restart", "never", "--", sys.executable, job, str(state_disk / "cache.bin"),
                            str(stamp)).stdout)  # fmt: skip
    wait_for(stamp.exists, timeout=60, what="the job to fill the disk and die")
    asked = time.monotonic()
    listed = tg("ps", timeout=10)
    assert listed.returncode == 0 and time.monotonic() - asked < 5, listed.stderr
    final = wait_for(lambda: (s := status(run_id))["state"] not in ("running", "restarting") and s, timeout=10,
                     what="the run's end recorded on the full disk")  # fmt: skip
    attempt = final["attempts"][0]
    assert attempt["cause"] == "disk_full", attempt
    assert _ended(final) - float(stamp.read_text()) < 3, "the end was recorded late"
    assert shutil.disk_usage(state_disk).free < 8 << 20  # the disk is still full: nobody made room
    shown = tg("logs", run_id, timeout=10)
    assert "No space left on device" in shown.stdout, shown.stdout[-2000:]


def test_on_a_tiny_state_disk_a_job_that_fills_it_still_ends_at_its_true_end(tmp_path: Path, monkeypatch) -> None:
    """A 16 MB state disk (a small quota, a tmpfs) is below the size that holds the usual reserve;
    it holds a small one all the same, or the end has nowhere to go and the run shows running."""
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    with faults.small_tmpfs(tmp_path / "tiny", "16m") as home:
        monkeypatch.setenv("TRAINGUARD_HOME", str(home))
        stamp = tmp_path / "died"
        job = script(tmp_path, "fill.py", FILL_THE_DISK)
        run_id = run_id_from(tg("run", "--restart", "never", "--", sys.executable, job, str(home / "cache.bin"),
                                str(stamp)).stdout)  # fmt: skip
        wait_for(stamp.exists, timeout=60, what="the job to fill the disk and die")
        final = wait_for(lambda: (s := status(run_id))["state"] not in ("running", "restarting") and s, timeout=10,
                         what="the run's end recorded on the full tiny disk")  # fmt: skip
        assert final["attempts"][0]["cause"] == "disk_full", final["attempts"][0]
        assert _ended(final) - float(stamp.read_text()) < 3, "the end was recorded late"
        asked = time.monotonic()
        stopped = tg("stop", run_id, timeout=30)  # it answers at once: the run has ended (2.5 min before)
        assert "not running" in stopped.stderr and "Traceback" not in stopped.stderr, stopped.stderr
        assert time.monotonic() - asked < 10


def test_stop_on_a_state_disk_the_job_filled_answers_within_seconds(tmp_path: Path, state_disk: Path) -> None:
    """The job fills the state disk and lives on (it catches ENOSPC and waits): `stop` records its
    request in the state disk's reserve and the run ends stopped, in seconds."""
    job = script(tmp_path, "fill_and_wait.py", """
        import sys, time
        try:
            with open(sys.argv[1], "wb") as out:
                while True:
                    out.write(b"\\0" * (1 << 20))
                    out.flush()
        except OSError:
            print("disk full; waiting for room", flush=True)
        while True:
            time.sleep(0.2)
    """)
    run_id = run_id_from(tg("run", "--", sys.executable, job, str(state_disk / "cache.bin")).stdout)
    wait_for(lambda: shutil.disk_usage(state_disk).free < 1 << 20, timeout=30, what="the disk to fill")
    time.sleep(1.5)
    asked = time.monotonic()
    stopped = tg("stop", run_id, "--grace", "2s", timeout=60)
    took = time.monotonic() - asked
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert took < 10, f"stop took {took:.1f} s on the full disk"
    assert "Traceback" not in stopped.stderr
    final = wait_for(lambda: (s := status(run_id))["state"] == "stopped" and s, timeout=10, what="stopped")
    assert final["attempts"][0]["ended_at"] is not None


def test_following_a_log_that_rotates_misses_nothing_and_says_where_it_skipped(tmp_path: Path,
                                                                              state_disk: Path) -> None:  # fmt: skip
    """`logs -f` reads on while the live log is cut under it: every line the job wrote comes out once,
    in order, but for parts said to be dropped."""
    stamp = tmp_path / "ended"
    job = script(tmp_path, "flood.py", FLOOD.replace("2000", "200"))  # ~2 MB/s
    run_id = run_id_from(tg("run", "--restart", "never", "--log-max-size", "1M", "--log-backups", "1", "--",
                            sys.executable, job, "8", str(stamp)).stdout)  # fmt: skip
    followed = tg("logs", run_id, "-f", timeout=90)
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    numbers = [int(line.split()[1]) for line in lines if line.startswith("line ") and line.endswith("x" * 90)]
    marked = sum("output dropped here" in line for line in lines)
    jumps = [(a, b) for a, b in pairwise(numbers) if b != a + 1]
    assert len(jumps) <= marked, f"holes not marked: {jumps[:5]} ({marked} marked)"
    assert numbers[0] == 0, lines[:3]
    done = [line for line in lines if line.startswith("DONE ")]
    assert len(done) == 1 and int(done[0].split()[1]) == numbers[-1] + 1, lines[-3:]
    assert len(numbers) == numbers[-1] + 1 or marked, "lines came out twice"
    record = json.loads((_run_folder(state_disk, run_id) / "attempt-1.kept.json").read_text())
    assert record["rotations"] >= 3, record  # it did follow across cuts
