"""`trainguard top` against real runs started with `trainguard run` in a state folder of its own: one
running (a job training with the Checkpointer under a memory limit), one failed (a bug), one
restarted (preempted, resumed, finished). The live view is driven headless through textual's pilot:
what it shows is read back from its widgets and from the screen it exports; its keys open the log
tail and the diagnosis, and stop the running run for real after a confirmation."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from tests.conftest import is_root
from tests.real.runs import wait_for
from trainguard.top import render

pytestmark = pytest.mark.real

TOY = [sys.executable, "-m", "trainguard.demo.toyjob"]
MEMORY_LIMIT = 512 * 1024**2


def tg(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINGUARD_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "trainguard", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def state_of(home: Path, ref: str) -> dict:
    return json.loads(tg(home, "status", ref, "--json").stdout)


def text_of(renderable, width: int = 160) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("top") / "state"
    limit = ["--memory-limit", str(MEMORY_LIMIT)] if is_root() else []
    started = tg(home, "run", "--name", "live", "--grace", "10s", *limit, "--", *TOY, "--steps", "100000",
                 "--step-seconds", "0.05")  # fmt: skip
    assert started.returncode == 0, started.stderr
    tg(home, "run", "--name", "broken", "--", *TOY, "--fault", "python_error", "--fault-step", "3")
    tg(home, "run", "--name", "preempt", "--", *TOY, "--steps", "30", "--fault", "preempted", "--fault-step", "10")
    wait_for(lambda: state_of(home, "broken")["state"] == "failed", what="the broken run to fail", timeout=60)
    wait_for(lambda: state_of(home, "preempt")["state"] == "succeeded", what="the preempted run to finish", timeout=60)
    wait_for(
        lambda: (state_of(home, "live")["attempts"][-1]["step"] or 0) > 10, what="the live run's progress", timeout=60
    )
    yield home
    if state_of(home, "live")["state"] == "running":
        tg(home, "stop", "live", "--grace", "1s")


def collector(home: Path):
    from trainguard.store.registry import Registry
    from trainguard.top.collect import Collector

    return Collector(Registry(home))


def test_the_snapshot_shows_each_real_run_as_it_is(home: Path) -> None:
    snap = collector(home).snapshot()
    runs = {r.name: r for r in snap.runs}
    assert set(runs) == {"live", "broken", "preempt"}
    assert snap.runs[0].name == "live"  # active runs first
    live, broken, preempt = runs["live"], runs["broken"], runs["preempt"]
    assert (live.state, live.attempt, live.active) == ("running", 1, True)
    assert live.step_from == "job" and live.step > 10 and live.steps_per_s and 5 < live.steps_per_s < 25
    assert live.checkpoint_age_s is not None and live.checkpoint_age_s < 10  # a checkpoint every 5 steps
    assert live.rss and 5 * 2**20 < live.rss < MEMORY_LIMIT  # a Python process tree, measured now
    if is_root():
        assert live.limit == MEMORY_LIMIT and live.limit_is_own
    # The step moves between two snapshots: it comes from the job's own reports, not a stale copy.
    later = wait_for(
        lambda: next(r for r in collector(home).snapshot().runs if r.name == "live").step > live.step, timeout=60
    )
    assert later
    assert (broken.state, broken.attempt, broken.last_cause) == ("failed", 1, "python_error")
    assert broken.rss is None and not broken.active
    assert (preempt.state, preempt.attempt) == ("succeeded", 2)
    assert preempt.step == 29 and 0 < preempt.goodput < 1
    # Its death alert cleared when attempt 2 resumed and finished: what is left is the cause it died of.
    assert preempt.alert is None and preempt.last_cause == "preempted"
    assert snap.gpus == () and "no NVIDIA GPU" in text_of(render.gpu_panel(snap, 120, "en"))
    assert snap.host.mem_total and snap.host.shm_total and snap.host.disks[0].label == "state"


def test_a_job_process_is_matched_to_its_run_through_its_attempt_cgroup(home: Path) -> None:
    """The rule top uses for every process NVML lists on a GPU, on the live job's real process."""
    from trainguard.top.model import owner_of

    info = state_of(home, "live")
    cgroup_text = Path(f"/proc/{info['pid']}/cgroup").read_text()
    found = owner_of(cgroup_text, [info["pid"]], {})
    if info["containment"] and info["containment"].startswith("cgroup"):
        assert found == (info["id"], 1)
    assert owner_of("0::/user.slice", [info["pid"], 1], {info["pid"]: info["id"]}) == (info["id"], None)
    assert owner_of("0::/user.slice", [os.getpid(), 1], {info["pid"]: info["id"]}) is None


def test_the_live_view_keys_log_diagnosis_and_a_confirmed_stop(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.top.app import ConfirmScreen, TextScreen, TopApp

    monkeypatch.setenv("TRAINGUARD_HOME", str(home))  # the stop key runs `trainguard stop` in this state folder
    app = TopApp(collector(home), interval=1.0, lang="en")
    seen: dict[str, str] = {}

    async def drive() -> None:
        async with app.run_test(size=(150, 40)) as pilot:
            await pilot.pause(0.3)
            seen["runs"] = text_of(app.query_one("#runs").content)
            seen["screen"] = app.export_screenshot()
            assert app.snapshot.runs[app.selected].name == "live"
            await pilot.press("l")
            await pilot.pause(0.3)
            assert isinstance(app.screen, TextScreen)
            seen["log_title"] = app.screen.title_text
            seen["log"] = text_of(app.screen.query_one("#text-body").content)
            await pilot.pause(1.5)  # the tail follows the log while it is open
            seen["log_later"] = text_of(app.screen.query_one("#text-body").content)
            await pilot.press("escape")
            broken = next(i for i, r in enumerate(app.snapshot.runs) if r.name == "broken")
            for _ in range(broken):
                await pilot.press("down")
            await pilot.press("d")
            await pilot.pause(0.3)
            seen["diagnosis"] = text_of(app.screen.query_one("#text-body").content)
            await pilot.press("escape")
            await pilot.press("s")  # an ended run: nothing to stop, said on the status line
            await pilot.pause(0.2)
            seen["not_active"] = app.message
            for _ in range(broken):
                await pilot.press("up")
            await pilot.press("s")
            await pilot.pause(0.2)
            assert isinstance(app.screen, ConfirmScreen)
            seen["question"] = app.screen.question
            await pilot.press("n")  # keep it running
            await pilot.pause(0.5)
            seen["after_no"] = state_of(home, "live")["state"]
            await pilot.press("s")
            await pilot.pause(0.2)
            await pilot.press("y")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and state_of(home, "live")["state"] == "running":
                await pilot.pause(0.5)
            await pilot.pause(1.5)
            seen["after_stop_runs"] = text_of(app.query_one("#runs").content)

    asyncio.run(drive())
    for name in ("live", "broken", "preempt"):
        assert name in seen["runs"] and name in seen["screen"]
    assert "RSS / LIMIT" in seen["runs"] and "GOODPUT" in seen["runs"] and "python_error" in seen["runs"]
    assert "attempt 1" in seen["log_title"] and "attempt-1.log" in seen["log_title"]
    last_step = [line for line in seen["log"].splitlines() if line.startswith("step ")][-1]
    later_step = [line for line in seen["log_later"].splitlines() if line.startswith("step ")][-1]
    assert int(later_step.split()[1]) > int(last_step.split()[1])
    assert "python_error" in seen["diagnosis"] and "KeyError" in seen["diagnosis"] and "What to do" in seen["diagnosis"]
    assert "broken" in seen["not_active"] and "not running" in seen["not_active"]
    assert "Stop run live?" in seen["question"] and "10 s" in seen["question"]
    assert seen["after_no"] == "running"
    final = state_of(home, "live")
    assert final["state"] == "stopped" and final["attempts"][-1]["cause"] is None  # a stop asked for, not a death
    assert "stopped" in seen["after_stop_runs"]


def test_a_narrow_terminal_gets_fewer_columns_and_chinese_texts(home: Path) -> None:
    snap = collector(home).snapshot()
    wide = text_of(render.runs_table(snap, 0, 150, "en"), 150)
    medium = text_of(render.runs_table(snap, 0, 90, "en"), 90)
    narrow = text_of(render.runs_table(snap, 0, 50, "en"), 50)
    assert "GOODPUT" in wide and "GOODPUT" not in medium and "RSS / LIMIT" in medium
    assert "RSS" not in narrow and "STEP" in narrow and all(len(line) <= 50 for line in narrow.splitlines())
    at_80 = text_of(render.runs_table(snap, 0, 80, "en"), 80)
    assert "ALERT" in at_80 and "python_error" in at_80 and "preempted" in at_80  # the alert column stays
    assert all(name in at_80 for name in ("live", "broken", "preempt"))
    zh = text_of(render.whole_view(snap, 120, "zh"), 120)
    assert "运行" in zh and "看不到 NVIDIA GPU" in zh and "失败" in zh and "内存" in zh


def test_top_once_prints_the_view_without_a_terminal(home: Path) -> None:
    done = tg(home, "top")
    assert done.returncode == 0, done.stderr
    assert "broken" in done.stdout and "preempt" in done.stdout and "no NVIDIA GPU visible" in done.stdout
    assert all(line == line.rstrip() for line in done.stdout.splitlines())
