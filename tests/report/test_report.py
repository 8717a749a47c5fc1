"""`trainguard report`: a self-contained page of a real run, rendered in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def tg(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINGUARD_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "trainguard", *args], env=env, capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> tuple[Path, str]:
    home = tmp_path_factory.mktemp("state")
    tg(home, "run", "--foreground", "--sample-interval", "0.2s", "--", sys.executable, "-m", "trainguard.demo.toyjob",
       "--steps", "30", "--fault", "preempted", "--fault-step", "15", "--step-seconds", "0.05")  # fmt: skip
    run_id = json.loads(tg(home, "ps", "--json").stdout)[0]["id"]
    done = tg(home, "report", run_id)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip()), run_id


def test_the_page_is_self_contained_and_tells_the_story(page) -> None:
    path, run_id = page
    text = path.read_text()
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=\"http", text)
    assert f"run {run_id}" in text and "Attempts" in text
    assert "preempted" in text and "Received SIGTERM: state saved at step 15" in text  # the death's evidence
    assert "checkpoint step" in text  # checkpoints marked on the timeline
    assert "Plotly.newPlot" in text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_page_renders_in_headless_chromium_without_errors(page, tmp_path: Path) -> None:
    path, _ = page
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
             "--v=0", "--virtual-time-budget=5000"]  # fmt: skip
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120,
                         check=False)  # fmt: skip
    assert "main-svg" in dom.stdout, "plotly drew no chart: its script failed to run"
    console_errors = [
        line for line in dom.stderr.splitlines() if "Uncaught" in line or ("CONSOLE(" in line and "rror" in line)
    ]
    assert console_errors == []
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1200,1400", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, timeout=120, check=False)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 20_000


def test_an_unknown_run_is_one_line(tmp_path: Path) -> None:
    done = tg(tmp_path, "report", "nosuchrun")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no run" in done.stderr
