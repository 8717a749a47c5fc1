"""trainguard's metrics through a real Prometheus: the example config of monitoring/ (with a 1 s
scrape) scrapes `trainguard exporter` and a run's `--metrics-port` while real runs live and die (a
bug, a memory-cgroup OOM kill and its restart, a hang and its restart). What a user graphs and is
alerted on is read back from Prometheus's HTTP API; every panel of the Grafana dashboard is evaluated
there; the shipped alerting rules load and fire on real series."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.monitor.prometheus import DASHBOARD, EXAMPLE_CONFIG, RULES, Prometheus, free_port, why_no
from tests.real import faults
from trainguard.probes.memory import cgroup_limit

pytestmark = [pytest.mark.real, pytest.mark.slow]

MIB = 1024 * 1024

HANGS_ONCE = """
    import os, time
    from trainguard import Checkpointer
    ckpt = Checkpointer(every=None, every_steps=10)  # a checkpoint about every 2 s
    state = ckpt.load_latest()
    start = state["step"] + 1 if state else 0
    for step in range(start, 1_000_000):
        ckpt.maybe_save(step, {"step": step})
        print("step", step, flush=True)
        # long enough for Prometheus to discover and scrape the run before it hangs
        if step == 45 and os.environ["TRAINGUARD_ATTEMPT"] == "1":
            time.sleep(3600)  # a collective that never completes
        time.sleep(0.2)
"""

def example_config(folder: Path) -> Path:
    """monitoring/prometheus.yml as a user would deploy it, next to the rules and node list, with a
    1 s scrape and rule interval, no Alertmanager, and a second job for runs' own metrics ports."""
    text = EXAMPLE_CONFIG.read_text()
    for old, new in [("scrape_interval: 15s", "scrape_interval: 1s\n  scrape_timeout: 1s"),
                     ("evaluation_interval: 15s", "evaluation_interval: 1s")]:  # fmt: skip
        assert text.count(old) == 1, f"the example config no longer says {old!r}: update this test"
        text = text.replace(old, new)
    text = re.sub(r"\nalerting:\n(  .*\n|\n)*", "\n", text)
    assert "alertmanagers" not in text
    text += '  - job_name: trainguard-run\n    file_sd_configs:\n      - files: ["trainguard-runs.yml"]\n'
    (folder / RULES.name).write_text(RULES.read_text())
    for targets in ("trainguard-nodes.yml", "trainguard-runs.yml"):
        (folder / targets).write_text("[]\n")
    config = folder / "prometheus.yml"
    config.write_text(text)
    return config


def set_targets(folder: Path, file: str, addresses: list[str], labels: dict[str, str]) -> None:
    """A file_sd target list in the example's format (JSON is YAML), replaced atomically."""
    tmp = folder / f".{file}.tmp"
    tmp.write_text(json.dumps([{"targets": addresses, "labels": labels}]))
    os.replace(tmp, folder / file)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    if reason := why_no("prometheus"):
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("prometheus")
    server = Prometheus(folder, example_config(folder))
    try:
        yield server
    finally:
        server.close()


@dataclass
class World:
    """The runs the module's Prometheus watches, by name, and why a part could not be made."""

    prometheus: Prometheus
    home: Path
    env: dict[str, str]
    exporter_port: int
    runs: dict[str, str] = field(default_factory=dict)  # name -> run id
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason

    def tg(self, *args: str, timeout: float = 180, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                              timeout=timeout, check=False, env=self.env, **kwargs)  # fmt: skip

    def status(self, name: str) -> dict:
        return json.loads(self.tg("status", self.runs[name], "--json").stdout)


def _job(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def world(prometheus: Prometheus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("runs")
    home = folder / "state"
    env = dict(os.environ, TRAINGUARD_HOME=str(home))
    world = World(prometheus, home, env, free_port())
    exporter = subprocess.Popen([sys.executable, "-m", "trainguard", "exporter", "--port", str(world.exporter_port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    set_targets(prometheus.folder, "trainguard-nodes.yml", [f"127.0.0.1:{world.exporter_port}"], {"cluster": "test"})
    try:
        # Lives through the module: hangs once, is restarted, then trains and checkpoints until stopped.
        # Scraped through its own --metrics-port as well as through the exporter.
        run_port = free_port()
        started = world.tg("run", "--name", "hangs-once", "--metrics-port", str(run_port), "--hang-timeout", "2s",
                           "--grace", "2s", "--", sys.executable, _job(folder, "hang.py", HANGS_ONCE))  # fmt: skip
        assert started.returncode == 0, started.stderr
        world.runs["hangs-once"] = started.stdout.split("started run ", 1)[1].split()[0]
        set_targets(prometheus.folder, "trainguard-runs.yml", [f"127.0.0.1:{run_port}"], {})
        prometheus.wait_for('up{job="trainguard-run"} == 1')

        buggy = _job(folder, "buggy.py", 'import trainguard\nprint("step 0", flush=True)\nprint({"cat": 0}["bird"])\n')
        done = world.tg("run", "--foreground", "--name", "buggy", "--", sys.executable, buggy)
        assert done.returncode == 78, done.stderr  # EX_CONFIG: a bug needs a fix first
        world.runs["buggy"] = json.loads(world.tg("status", "buggy", "--json").stdout)["id"]

        if reason := faults.why_no_memory_cgroup():
            world.skipped["ooms-once"] = reason
        else:
            oom = _job(folder, "oom.py", faults.OOM_ONCE_JOB)
            with faults.memory_cgroup(160 * MIB) as procs:
                done = subprocess.run(
                    ["bash", "-c", f'echo $$ > {procs}; exec "{sys.executable}" -m trainguard run --foreground '
                                   f'--name ooms-once -- "{sys.executable}" {oom}'],
                    capture_output=True, text=True, timeout=180, check=False, env=env,
                )  # fmt: skip
            assert done.returncode == 0, done.stderr
            world.runs["ooms-once"] = json.loads(world.tg("status", "ooms-once", "--json").stdout)["id"]

        _wait(
            lambda: (lambda s: len(s["attempts"]) == 2 and s["state"] == "running")(world.status("hangs-once")),
            90,
            "the hung attempt to be restarted",
        )
        # Prometheus has caught up when it shows every run in its final state through both jobs.
        final = {"hangs-once": "running", "buggy": "failed", "ooms-once": "succeeded"}
        final = {world.runs[name]: state for name, state in final.items() if name in world.runs}
        for job, runs in [("trainguard", final), ("trainguard-run", {world.runs["hangs-once"]: "running"})]:
            prometheus.wait_for(f'trainguard_run_state_info{{job="{job}"}} == 1',
                                lambda r, runs=runs: {x["metric"]["run"]: x["metric"]["state"] for x in r} == runs)  # fmt: skip
        yield world
    finally:
        if "hangs-once" in world.runs:
            stopped = world.tg("stop", world.runs["hangs-once"], timeout=60)
            if stopped.returncode != 0:
                with contextlib.suppress(Exception):
                    os.killpg(world.status("hangs-once")["pid"], signal.SIGKILL)
        exporter.terminate()
        exporter.wait(20)


def _by(result: list[dict], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): r["value"] for r in result}


def test_run_state_attempts_and_deaths_by_cause_as_prometheus_records_them(world: World) -> None:
    prom, runs = world.prometheus, world.runs
    # Each run as the exporter serves it, the live one also through its own port.
    states = prom.query('trainguard_run_state_info{job="trainguard"} == 1')
    assert {r["metric"]["name"]: r["metric"]["state"] for r in states} == {
        "hangs-once": "running", "buggy": "failed", **({"ooms-once": "succeeded"} if "ooms-once" in runs else {})}  # fmt: skip
    assert all(r["metric"]["cluster"] == "test" for r in states), "the node list's labels reach the series"
    own_port = prom.query(f'trainguard_run_state_info{{job="trainguard-run", run="{runs["hangs-once"]}"}}')
    assert [r["metric"]["state"] for r in own_port] == ["running"]
    assert not prom.query(f'trainguard_run_state_info{{job="trainguard-run", run!="{runs["hangs-once"]}"}}'), (
        "--metrics-port serves its own run only"
    )
    # Prometheus watched the hang happen: through the run's own port it saw attempt 1, then attempt 2.
    seen = f'trainguard_run_attempts_total{{job="trainguard-run", run="{runs["hangs-once"]}"}}'
    assert [r["value"] for r in prom.query(f"min_over_time({seen}[5m])")] == [1]
    assert [r["value"] for r in prom.query(seen)] == [2]

    attempts = _by(prom.query('trainguard_run_attempts_total{job="trainguard"}'), "name")
    assert attempts == {"hangs-once": 2, "buggy": 1} | ({"ooms-once": 2} if "ooms-once" in runs else {})
    deaths = {(r["metric"]["name"], r["metric"]["cause"]): r["value"]
              for r in prom.query('trainguard_run_deaths_total{job="trainguard"}')}  # fmt: skip
    expected = {("hangs-once", "hang"): 1, ("buggy", "python_error"): 1}
    if "ooms-once" in runs:
        expected[("ooms-once", "host_oom")] = 1
    assert deaths == expected
    assert _by(prom.query('trainguard_run_deaths_total{job="trainguard-run"}'), "cause") == {"hang": 1}
    if "ooms-once" in world.skipped:
        pytest.skip(f"no cgroup OOM run: {world.skipped['ooms-once']}")


def test_checkpoint_age_falls_at_each_checkpoint_and_the_interval_is_the_runs_gap(world: World) -> None:
    prom, run = world.prometheus, world.runs["hangs-once"]
    age = f'trainguard_run_last_checkpoint_age_seconds{{job="trainguard", run="{run}"}}'
    # a sawtooth: Prometheus saw the age drop back (a new checkpoint) at least twice
    prom.wait_for(f"resets({age}[30s]) >= 2", timeout=60)
    assert 0 <= prom.query(age)[0]["value"] < 15
    # the job saves every 10 steps of 0.2 s: about 2 s apart (more under load, never less)
    interval = prom.wait_for(f'trainguard_run_checkpoint_interval_seconds{{job="trainguard", run="{run}"}}')
    assert 1.9 <= interval[0]["value"] <= 8, interval
    ended = _by(prom.query('trainguard_run_end_time_seconds{job="trainguard"}'), "name")
    assert "hangs-once" not in ended and abs(ended["buggy"] - time.time()) < 600


def test_host_memory_matches_the_machine(world: World) -> None:
    prom = world.prometheus
    limit = cgroup_limit(Path("/proc/self/cgroup").read_text())
    total = prom.wait_for('trainguard_host_memory_total_bytes{job="trainguard"}')[0]["value"]
    assert total == min(psutil.virtual_memory().total, limit or float("inf"))
    available = prom.query('trainguard_host_memory_available_bytes{job="trainguard"}')[0]["value"]
    assert 0 < available <= total
    assert abs(available - psutil.virtual_memory().available) < 0.2 * total
    swap = prom.query('trainguard_host_swap_used_bytes{job="trainguard"}')[0]["value"]
    assert swap == pytest.approx(psutil.swap_memory().used, abs=256 * MIB)


def test_dev_shm_filling_and_emptying_shows_in_prometheus(world: World) -> None:
    prom = world.prometheus
    stat = os.statvfs("/dev/shm")
    size = prom.wait_for('trainguard_shm_size_bytes{job="trainguard"}')[0]["value"]
    assert size == stat.f_blocks * stat.f_frsize
    if stat.f_bavail * stat.f_frsize < 1024 * MIB:
        pytest.skip("/dev/shm has less than 1 GiB free: not filling it further")
    used = 'trainguard_shm_used_bytes{job="trainguard"}'
    before = prom.wait_for(used)[0]["value"]
    block = Path("/dev/shm") / f"trainguard-test-{os.getpid()}"
    try:
        with block.open("wb") as out:  # what DataLoader workers do with their batches
            for _ in range(256):
                out.write(b"\1" * MIB)
        prom.wait_for(used, lambda r: r and r[0]["value"] >= before + 250 * MIB)
    finally:
        block.unlink(missing_ok=True)
    prom.wait_for(used, lambda r: r and r[0]["value"] < before + 100 * MIB)
    assert prom.query(f"max_over_time({used}[1m]) - min_over_time({used}[1m])")[0]["value"] >= 250 * MIB


def _panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


@pytest.mark.parametrize("panel", _panels(), ids=lambda p: f"{p['id']}-{p['title']}")
def test_every_dashboard_panel_returns_series(world: World, panel: dict) -> None:
    prom, runs = world.prometheus, world.runs
    exprs = [target["expr"] for target in panel["targets"]]
    if any("trainguard_gpu_" in expr for expr in exprs):
        if not prom.query("trainguard_gpu_memory_total_bytes"):
            pytest.skip(
                f"GPU panel {panel['title']!r} excepted: no GPU here (NVML finds none), so no trainguard_gpu_* series"
            )
        if any("xid" in expr for expr in exprs) and not prom.query("trainguard_gpu_xid_events_total"):
            pytest.skip(f"panel {panel['title']!r} excepted: no Xid error in this machine's kernel log")
    results = {expr: prom.wait_for(expr, timeout=20) for expr in exprs}
    # Beyond "some series": what the panel must show for the runs of this module.
    if panel["title"].startswith("Deaths by cause"):
        expected = {"hang": 1, "python_error": 1} | ({"host_oom": 1} if "ooms-once" in runs else {})
        assert _by(results[exprs[0]], "cause") == expected, "each first death of a cause counts (not increase())"
    if panel["title"] == "Runs by state":
        expected = {"running": 1, "failed": 1} | ({"succeeded": 1} if "ooms-once" in runs else {})
        assert _by(results[exprs[0]], "state") == expected, "a run scraped twice counts once"
    if panel["title"] == "Attempts per run":
        assert _by(results[exprs[0]], "name") == {"hangs-once": 2, "buggy": 1} | (
            {"ooms-once": 2} if "ooms-once" in runs else {}
        )
    if panel["title"] == "Last checkpoint age":
        assert all(_by(result, "name").keys() == {"hangs-once"} for result in results.values()), "live runs only"
    for expr, result in results.items():
        assert all(r["value"] == r["value"] for r in result), f"{expr} gave NaN"


def test_the_shipped_rules_evaluate_on_real_series_and_a_failed_run_alerts(world: World) -> None:
    prom, runs = world.prometheus, world.runs
    firing = prom.wait_for('ALERTS{alertname="TrainguardRunFailed", alertstate="firing"}', timeout=30)
    assert [(r["metric"]["run"], r["metric"]["severity"]) for r in firing] == [(runs["buggy"], "critical")] * len(
        firing
    )
    assert {r["metric"]["job"] for r in firing} == {"trainguard"}
    groups = prom.api("rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == RULES.read_text().count("- alert:")
    assert [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
    alert = next(a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == "TrainguardRunFailed")
    assert runs["buggy"] in alert["annotations"]["description"] and "已失败" in alert["annotations"]["summary_zh"]
    # nothing else fires: the hung run recovered, the OOM-killed one finished, the host is fine
    assert {r["metric"]["alertname"] for r in prom.query('ALERTS{alertstate="firing"}')} == {"TrainguardRunFailed"}


def test_an_exporter_that_goes_away_is_noticed(world: World) -> None:
    prom = world.prometheus
    port = free_port()
    exporter = subprocess.Popen([sys.executable, "-m", "trainguard", "exporter", "--port", str(port)],
                                env=world.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    second = f"127.0.0.1:{port}"
    try:
        set_targets(
            prom.folder, "trainguard-nodes.yml", [f"127.0.0.1:{world.exporter_port}", second], {"cluster": "test"}
        )
        prom.wait_for(f'up{{job="trainguard", instance="{second}"}} == 1')
    finally:
        exporter.terminate()
        exporter.wait(20)
    try:
        pending = prom.wait_for(f'ALERTS{{alertname="TrainguardExporterDown", instance="{second}"}}')
        assert [r["metric"]["alertstate"] for r in pending] == ["pending"]  # `for: 2m` has not passed
        assert not prom.query(f'ALERTS{{alertname="TrainguardExporterDown", instance!="{second}"}}')
    finally:
        set_targets(prom.folder, "trainguard-nodes.yml", [f"127.0.0.1:{world.exporter_port}"], {"cluster": "test"})
