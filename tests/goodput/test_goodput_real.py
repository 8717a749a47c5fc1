"""Goodput of a real run with known faults, checked against what happened: `trainguard run` of a job
saving a checkpoint every 5 steps (0.25 s a step), SIGKILLed from outside after step 22, then killed
by its memory cgroup's OOM killer after step 32, then finishing at step 49. The figures `status`,
`status --json` and the exporter give are compared with the job's own log lines (the
steps each attempt printed, the step each resumed from) and the registry's times."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import is_root

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not is_root(), reason="needs root: a memory cgroup for the OOM kill"),
]

JOB = Path(__file__).with_name("faulty_job.py")
# A step long enough that a busy machine's scheduling jitter (a tenth of a second over a few steps,
# seen on CI's two cores) cannot pass for a step: steps redone after the last report are estimated
# from the time since it at the attempt's own pace.
STEP_S = 0.25


def tg(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINGUARD_HOME": str(home), "LANG": "C.UTF-8"}
    return subprocess.run([sys.executable, "-m", "trainguard", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def wait_for(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_goodput_of_a_run_killed_then_oom_killed_matches_its_logs(tmp_path: Path) -> None:
    home = tmp_path / "state"
    started = tg(home, "run", "--name", "gp", "--memory-limit", "300M", "--", sys.executable, str(JOB),
                 "--steps", "50", "--step-seconds", str(STEP_S), "--oom-attempt", "2", "--oom-step", "32")  # fmt: skip
    assert started.returncode == 0, started.stderr
    info = json.loads(tg(home, "status", "gp", "--json").stdout)
    log = Path(info["attempts"][0]["log_path"])
    wait_for(lambda: log.exists() and re.search(r"^step 22$", log.read_text(), re.MULTILINE))
    os.kill(info["pid"], signal.SIGKILL)
    from trainguard import goodput
    from trainguard.store.registry import Registry

    registry = Registry(home)
    wait_for(lambda: registry.resolve("gp").state in ("succeeded", "failed"))
    run = registry.resolve("gp")
    assert [a.cause for a in run.attempts] == ["killed", "host_oom", None]
    printed = [[int(s) for s in re.findall(r"^step (\d+)$", Path(a.log_path).read_text(), re.MULTILINE)]
               for a in run.attempts]  # fmt: skip
    resumed = [re.search(r"^resumed from step (\d+)$", Path(a.log_path).read_text(), re.MULTILINE)
               for a in run.attempts[1:]]  # fmt: skip
    resumed_steps = [int(m.group(1)) for m in resumed]
    assert resumed_steps == [19, 29]  # checkpoints every 5 steps: the newest before each death

    result = goodput.of_run(run, registry.events(run.id), now=time.time())
    killed, oom = result.losses
    for loss, died, steps, resumed_step in zip((killed, oom), run.attempts, printed, resumed_steps):
        # Steps redone: those the attempt printed after the checkpoint the next one resumed from.
        assert loss.recomputed_steps == max(steps) - resumed_step == 3
        assert loss.recomputed_s == pytest.approx(3 * STEP_S, abs=STEP_S / 2)
        after = run.attempts[died.n]  # the next attempt
        assert loss.restart_s == pytest.approx(after.progress["first_step_time"] - died.ended_at, abs=1e-6)
        assert 2.0 <= loss.restart_s < 4.0  # the 2 s backoff, a process start, loading the checkpoint
    assert killed.stalled_s < STEP_S  # killed while printing steps
    assert 0 < oom.stalled_s < 3  # filling memory after its last step until the OOM killer came
    parts = result.kept_s + result.recomputed_s + result.restart_s + result.stalled_s + result.overhead_s
    assert parts == pytest.approx(result.wall_s, abs=1e-6)
    assert result.wall_s == pytest.approx(run.attempts[-1].ended_at - run.attempts[0].started_at, abs=1e-6)
    assert result.kept_s == pytest.approx(47 * STEP_S, abs=3 * STEP_S)  # 50 steps, the first of each attempt is start-up

    # The same figures wherever a person or a scraper looks.
    shown = json.loads(tg(home, "status", "gp", "--json").stdout)["goodput"]
    assert shown["goodput"] == pytest.approx(result.ratio, abs=1e-3)
    assert [loss["recomputed_steps"] for loss in shown["losses"]] == [3, 3]
    text = tg(home, "status", "gp").stdout
    assert f"goodput: {100 * result.ratio:.0f}%" in text and "attempt 2 (host_oom)" in text
    from prometheus_client import CollectorRegistry, generate_latest

    from trainguard.monitor.exporter import TrainguardCollector

    scraped = CollectorRegistry(auto_describe=False)
    scraped.register(TrainguardCollector(registry))
    metrics = generate_latest(scraped).decode()
    ratio = re.search(r'^trainguard_run_goodput_ratio\{[^}]*name="gp"[^}]*\} (\S+)$', metrics, re.MULTILINE)
    assert ratio and float(ratio.group(1)) == pytest.approx(result.ratio, abs=1e-3)
    for kind in ("recomputed", "restart", "stalled"):
        assert re.search(rf'^trainguard_run_lost_seconds\{{[^}}]*kind="{kind}"', metrics, re.MULTILINE)


def test_a_hang_costs_the_steps_after_its_checkpoint_and_its_silence(tmp_path: Path) -> None:
    """A job that falls silent after step 32 (checkpoints every 5 steps), stopped by the hang
    watchdog, then resumed from step 29: 3 steps redone, and stalled from its last output until the
    watchdog's kill. The supervisor's own writes to the log (room kept for its tail, rotations) are
    no sign of life: before, they made the silence look like training (39 steps redone, of 3)."""
    home = tmp_path / "state"
    hang_s, grace_s = 3, 2
    started = tg(home, "run", "--name", "gp", "--hang-timeout", f"{hang_s}s", "--grace", f"{grace_s}s", "--",
                 sys.executable, str(JOB), "--steps", "45", "--step-seconds", "0.1", "--hang-attempt", "1",
                 "--hang-step", "32")  # fmt: skip
    assert started.returncode == 0, started.stderr
    from trainguard import goodput
    from trainguard.store.registry import Registry

    registry = Registry(home)
    wait_for(lambda: registry.resolve("gp").state in ("succeeded", "failed"))
    run = registry.resolve("gp")
    assert [a.cause for a in run.attempts] == ["hang", None]
    hung, after = run.attempts
    printed = [int(s) for s in re.findall(r"^step (\d+)$", Path(hung.log_path).read_text(), re.MULTILINE)]
    resumed = re.search(r"^resumed from step (\d+)$", Path(after.log_path).read_text(), re.MULTILINE)
    assert resumed and max(printed) == 32
    (loss,) = goodput.of_run(run, registry.events(run.id), now=time.time()).losses
    assert loss.cause == "hang"
    assert loss.recomputed_steps == max(printed) - int(resumed.group(1)) == 3
    # Silent from its last step until the watchdog fired (ticks are 1 s) and SIGTERM's grace ran out
    # (the job's handler only marks the stop; its loop never comes back to save).
    assert hang_s <= loss.stalled_s <= hang_s + grace_s + 2


@pytest.mark.parametrize(("save_every", "supervised"), [(0, True), (100, True), (100, False)],
                         ids=["no-checkpoint", "saves-on-stop", "saves-on-stop-no-supervisor"])  # fmt: skip
def test_a_stop_keeps_only_what_was_saved(tmp_path: Path, save_every: int, supervised: bool) -> None:
    """`trainguard stop` of a job that saves nothing loses all it trained; of one that saves on
    SIGTERM, nothing, whether its supervisor stops it or, the supervisor killed, `stop` itself does
    (before, that goodput was 0 %: the save the stop made was never recorded)."""
    home = tmp_path / "state"
    started = tg(home, "run", "--name", "gp", "--", sys.executable, str(JOB), "--steps", "1000",
                 "--save-every", str(save_every))  # fmt: skip
    assert started.returncode == 0, started.stderr
    log = Path(json.loads(tg(home, "status", "gp", "--json").stdout)["attempts"][0]["log_path"])
    wait_for(lambda: log.exists() and re.search(r"^step 20$", log.read_text(), re.MULTILINE))
    if not supervised:
        supervisor = int((log.parent / "supervisor.lock").read_text().split()[0])
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: json.loads(tg(home, "status", "gp", "--json").stdout)["supervisor"] != "running")
    assert tg(home, "stop", "gp").returncode == 0
    info = json.loads(tg(home, "status", "gp", "--json").stdout)
    assert info["state"] == "stopped"
    shown = info["goodput"]
    printed = max(int(s) for s in re.findall(r"^step (\d+)$", log.read_text(), re.MULTILINE))
    text = tg(home, "status", "gp").stdout
    if save_every == 0:
        assert shown["goodput"] == 0 and shown["kept_s"] == 0
        (loss,) = shown["losses"]
        assert loss["cause"] is None and not loss["redone"]
        assert abs(loss["recomputed_steps"] - printed) <= 1  # every step it printed, none saved
        assert "goodput: 0% (0.0 s of training kept" in text and "never saved" in text
    else:
        assert shown["losses"] == [] and shown["kept_s"] > 1.5 and shown["goodput"] > 0.5
        assert re.search(rf"^stopped after saving step {printed}$", log.read_text(), re.MULTILINE)
