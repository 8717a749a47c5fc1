"""The log bound holds for writers faster than a tick. Seen before: `yes` under `--log-max-size 5M`
took the run folder to 3.9 GB while it ran and left 1.4 GB after its end (the size was looked at once
a second, and nothing cut the last second's output), and a 200 MB line with no newline was kept
whole. Real jobs, a real run folder: its files are measured as the job writes."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.real.runs import run_id_from, status, tg, wait_for
from trainguard.supervisor.log_policy import LogBound, MiB

pytestmark = pytest.mark.real

BOUND = LogBound(max_size=5 * MiB)
SLACK = 1 * MiB  # the live file's few last lines and the supervisor's markers


def _folder_bytes(folder: Path) -> tuple[int, int]:
    """(disk space the folder's files take, their sizes together)."""
    taken = size = 0
    for entry in folder.glob("*"):
        try:
            stat = entry.lstat()
        except OSError:
            continue
        if entry.is_file() and not entry.is_symlink():
            taken, size = taken + stat.st_blocks * 512, size + stat.st_size
    return taken, size


def _run_watching_the_folder(home: Path, *command: str) -> tuple[str, int]:
    """Start the run, sample its folder until it ends; (run id, the most space its files took)."""
    run_id = run_id_from(tg("run", "--restart", "never", "--log-max-size", "5M", "--", *command).stdout)
    folder, peak, done = home / "runs" / run_id, 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _folder_bytes(folder)[0])
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wait_for(lambda: status(run_id)["state"] not in ("starting", "running"), timeout=60, what="the run's end")
    finally:
        done.set()
        sampler.join()
    return run_id, peak


def test_yes_keeps_its_run_folder_within_the_bound_while_it_runs_and_after(home: Path) -> None:
    run_id, peak = _run_watching_the_folder(home, "timeout", "4", "yes")
    assert status(run_id)["state"] == "failed"  # timeout's 124
    # Looked at as often as every 50 ms while it writes this fast: it overshoots by what `yes`
    # writes in that moment and a rotation's copy, not by a second of it (1.2 GB here before).
    assert peak < 40 * BOUND.max_size, f"the run folder took {peak / MiB:.0f} MiB while the job ran"
    _, after = _folder_bytes(home / "runs" / run_id)
    assert after <= BOUND.attempt_bytes + SLACK, f"{after / MiB:.1f} MiB left after the end"
    shown = tg("logs", run_id)
    assert shown.returncode == 0 and "output dropped here" in shown.stdout
    last = shown.stdout.rstrip().splitlines()[-1]
    assert last.startswith("==== trainguard") and "run failed" in last, last  # the run's end, kept after the cut


def test_a_long_line_with_no_newline_is_cut_to_the_bound(home: Path) -> None:
    writes = "import sys; sys.stdout.write('x' * (200 << 20)); sys.stdout.flush()"
    run_id, _ = _run_watching_the_folder(home, sys.executable, "-c", writes)
    assert status(run_id)["state"] == "succeeded"
    _, after = _folder_bytes(home / "runs" / run_id)
    assert after <= BOUND.attempt_bytes + SLACK, f"{after / MiB:.1f} MiB left of a 200 MiB line"
    shown = tg("logs", run_id)
    assert shown.returncode == 0 and "output dropped here" in shown.stdout
    kept = shown.stdout.count("x")
    assert BOUND.max_size <= kept <= BOUND.head_bytes + 2 * BOUND.max_size, kept


def test_a_job_that_writes_slowly_is_looked_at_once_a_tick(home: Path) -> None:
    """The sooner looks are for fast writers only: an idle job's supervisor stays idle."""
    run_id = run_id_from(tg("run", "--restart", "never", "--", "sleep", "6").stdout)
    lock = home / "runs" / run_id / "supervisor.lock"
    pid = int(wait_for(lambda: lock.exists() and lock.read_text().split()[0], timeout=20, what="the supervisor"))
    time.sleep(1.5)  # past the first looks that learn the log's rate
    before = _cpu_s(pid)
    time.sleep(3)
    used = _cpu_s(pid) - before
    assert used < 0.5, f"an idle run's supervisor used {used:.2f} s of CPU in 3 s"
    wait_for(lambda: status(run_id)["state"] == "succeeded", timeout=30, what="the run's end")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
