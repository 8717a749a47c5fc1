"""Fault experiments against the real supervisor: every test here breaks something on purpose (kills,
races, full and removed disks, damaged files) and checks that the promise still holds."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real.runs import tg


def cgroups_of(run_id: str) -> list[Path]:
    """Cgroup folders trainguard made for a run's attempts, in any hierarchy."""
    found = []
    for root in Path("/sys/fs/cgroup").iterdir():
        if root.is_dir():
            found += list(root.rglob(f"trainguard-{run_id}-*"))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.fixture
def cleanup_pids() -> Iterator[list[int]]:
    """Pids (process groups) a test started outside trainguard: killed whatever the outcome."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _stop_every_run(home: Path) -> Iterator[None]:
    """No experiment leaves a job running: whatever is still active is stopped at the end."""
    yield
    import json

    listed = tg("ps", "--json")
    if listed.returncode == 0:
        for run in json.loads(listed.stdout):
            if run["state"] in ("running", "restarting"):
                tg("stop", run["id"], "--grace", "1s")
