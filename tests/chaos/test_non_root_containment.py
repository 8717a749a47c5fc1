"""Without root the supervisor contains a job by its session and as a child subreaper: orphans of the
job come back to it, and die with their attempt. A zombie among them is dead: killing it again until
a timeout held every death, stop and restart of a user without root for 10 s. Real second user."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.chaos.users import as_user, skip_unless_runnable, user_named
from trainguard._proc import pid_alive

pytestmark = [pytest.mark.real, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")]


def test_a_job_that_leaves_an_orphan_ends_at_once_and_takes_the_orphan_with_it(shared: Path) -> None:
    carol = user_named("tg-carol")
    skip_unless_runnable(carol, shared)
    state = shared / "sticky"
    state.mkdir(exist_ok=True)
    state.chmod(0o1777)
    home = state / "carol-state"
    pid_file = shared / "orphan.pid"
    pid_file.touch()
    pid_file.chmod(0o666)
    began = time.monotonic()
    done = as_user(carol, shared, home, "run", "--foreground", "--max-restarts", "0", "--",
                   "sh", "-c", f"sleep 300 & echo $! > {pid_file}; echo started; exit 3")  # fmt: skip
    took = time.monotonic() - began
    assert done.returncode != 0 and "started" in done.stdout, done.stderr[-2000:]
    run = json.loads(as_user(carol, shared, home, "ps", "--json").stdout)[0]
    assert run["containment"].startswith("partial"), run["containment"]  # no cgroups as carol
    orphan = int(pid_file.read_text())
    assert not pid_alive(orphan), "the orphaned sleep outlived its attempt"
    # Before, the zombie of the killed sleep was killed again for KILL_TIMEOUT_S (10 s).
    assert took < 8, f"the run took {took:.1f} s to end"
