"""`trainguard demo`: every scenario that can run here runs, is named right and recovers by policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.real


def test_the_demo_names_every_fault_and_recovers_as_the_policy_says() -> None:
    done = subprocess.run([sys.executable, "-m", "trainguard", "demo", "--json"], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    report = json.loads(done.stdout)["scenarios"]
    by_name = {s["name"]: s for s in report}
    assert set(by_name) == {"terminal_closed", "host_oom", "shm_exhausted", "preempted", "hang", "disk_full",
                            "python_error", "cuda_oom"}  # fmt: skip
    for scenario in report:
        assert set(scenario) == {"name", "real", "skipped", "expected_cause", "cause", "confidence", "restarted",
                                 "resumed_from_step", "steps_lost", "seconds", "passed"}  # fmt: skip
        if scenario["skipped"] is None:
            assert scenario["passed"], scenario
            assert scenario["cause"] == scenario["expected_cause"], scenario
    if os.geteuid() == 0:
        assert all(s["skipped"] is None for s in report), [s for s in report if s["skipped"]]
    assert by_name["preempted"]["steps_lost"] == 0 and by_name["preempted"]["restarted"]
    assert by_name["host_oom"]["resumed_from_step"] is not None
    assert by_name["cuda_oom"]["real"] is False  # said plainly: a replayed log on a machine without GPU
    assert done.returncode == 0
    assert sum(s["seconds"] for s in report) < 120


def test_an_unknown_scenario_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "trainguard", "demo", "--scenario", "meteor"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "no scenario 'meteor'" in done.stderr and done.stderr.count("\n") == 1
