"""Everything that can be checked before a run detaches is checked, and what the detached supervisor
finds wrong reaches the person who started it: one line, exit 2, and no run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.runs import tg

pytestmark = pytest.mark.real


def _no_runs() -> bool:
    listed = tg("ps", "--json")
    return listed.returncode == 0 and json.loads(listed.stdout) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--checkpoint-dir", "/proc/1/xx"], "--checkpoint-dir /proc/1/xx: cannot write there"),
        (["--memory-limit", "1"], "--memory-limit must be between 64M"),
        (["--memory-limit", "99999999999999999999999999T"], "--memory-limit"),
        (["--memory-limit", "100000T"], "--memory-limit must be between 64M"),
        (["--resume-arg", "--resume"], "has no {checkpoint}"),
    ],
)
def test_bad_run_options_are_refused_before_anything_starts(home: Path, args: list[str], says: str) -> None:
    done = tg("run", *args, "--", "true")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert _no_runs()


def test_a_run_from_a_folder_that_was_removed_is_one_line(tmp_path: Path, home: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    shell = subprocess.run(["bash", "-c", f'cd {gone} && rmdir {gone} && exec "$@"', "x", sys.executable, "-m",
                            "trainguard", "run", "--", "true"], capture_output=True, text=True, check=False)  # fmt: skip
    assert shell.returncode == 2 and "current folder no longer exists" in shell.stderr
    assert shell.stderr.count("\n") == 1


def test_started_means_the_job_runs(tmp_path: Path, home: Path) -> None:
    done = tg("run", "--", "sleep", "30")
    assert done.returncode == 0
    pid = int(done.stdout.split("(pid ", 1)[1].split(")")[0])
    assert os.path.exists(f"/proc/{pid}")
    tg("stop", done.stdout.split("started run ", 1)[1].split()[0], "--grace", "1s")
