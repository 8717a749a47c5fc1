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


def supervisors_of(run_id: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"trainguard.supervisor" in argv and run_id.encode() in argv:
            found.append(int(entry.name))
    return found


def sleeping_jobs(home: Path) -> list[int]:
    """Live `sleep` processes started with the state folder ``home``: the jobs of these tests."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            ours = entry.name.isdigit() and f"TRAINGUARD_HOME={home}".encode() in (entry / "environ").read_bytes()
            if ours and b"sleep" in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def env_with_hook(tmp_path: Path, code: str, **variables: str) -> dict[str, str]:
    """An environment whose Python processes (the supervisor among them) run ``code`` as they start
    (a sitecustomize on PYTHONPATH): it picks the moment a real fault strikes inside the supervisor."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(code)
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **variables)


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


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user can reach, with a copy of trainguard's source in it (tests/chaos/users.py)."""
    from tests.chaos.users import shared_folder

    with shared_folder() as folder:
        yield folder
