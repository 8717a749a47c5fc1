"""The alerting rules and example config of monitoring/: promtool checks and unit-tests them (slow
tier: Prometheus's own tool); the default tier checks what people rely on when they load them as
they are: severities, English and Chinese texts, a firing and a quiet unit test for every rule, and
only metrics the exporter serves."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from collections import Counter
from importlib.resources import files
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from tests.monitor.prometheus import DASHBOARD, EXAMPLE_CONFIG, RULE_TESTS, RULES, why_no
from trainguard.monitor.exporter import TrainguardCollector
from trainguard.store.registry import Registry

CJK = re.compile(r"[\u4e00-\u9fff]")


def _alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def _promtool(*args: str) -> subprocess.CompletedProcess:
    if reason := why_no("promtool"):
        pytest.skip(reason)
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_promtool_finds_the_rules_valid() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout


@pytest.mark.slow
def test_promtool_unit_tests_prove_each_rule_fires_and_stays_quiet() -> None:
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.slow
def test_the_example_prometheus_config_is_valid_and_discovers_every_node() -> None:
    done = _promtool("check", "config", str(EXAMPLE_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in done.stdout, "the example loads the shipped rules"
    found = _promtool("check", "service-discovery", "--timeout=3s", str(EXAMPLE_CONFIG), "trainguard")
    assert found.returncode == 0, found.stderr
    targets = {t["labels"]["instance"]: t["labels"].get("cluster") for t in json.loads(found.stdout)}
    listed = yaml.safe_load((EXAMPLE_CONFIG.parent / "trainguard-nodes.yml").read_text())
    assert targets == {address: group["labels"]["cluster"] for group in listed for address in group["targets"]}
    assert len(targets) >= 3


def test_every_rule_has_a_severity_and_english_and_chinese_texts() -> None:
    alerts = _alerts()
    assert {a["alert"] for a in alerts} >= {
        "TrainguardRunCrashLooping", "TrainguardRunFailed", "TrainguardCheckpointStale",
        "TrainguardHostMemoryRunningOut", "TrainguardShmRunningOut", "TrainguardGpuXid", "TrainguardGpuHot",
        "TrainguardGpuThrottled", "TrainguardExporterDown"}  # fmt: skip
    for alert in alerts:
        assert alert["labels"]["severity"] in ("warning", "critical"), alert["alert"]
        notes = alert["annotations"]
        assert set(notes) == {"summary", "description", "summary_zh", "description_zh"}, alert["alert"]
        assert all(CJK.search(notes[key]) for key in ("summary_zh", "description_zh")), alert["alert"]
        assert not any(CJK.search(notes[key]) for key in ("summary", "description")), alert["alert"]
    assert "predict_linear" in next(a for a in alerts if a["alert"] == "TrainguardHostMemoryRunningOut")["expr"]
    assert "predict_linear" in next(a for a in alerts if a["alert"] == "TrainguardShmRunningOut")["expr"]


def test_every_rule_has_a_unit_test_where_it_fires_and_one_where_it_stays_quiet() -> None:
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    fires = Counter(case["alertname"] for case in cases if case["exp_alerts"])
    quiet = Counter(case["alertname"] for case in cases if not case["exp_alerts"])
    names = {a["alert"] for a in _alerts()}
    assert names - set(fires) == set(), "rules no test makes fire"
    assert names - set(quiet) == set(), "rules no test proves quiet"
    assert set(fires) | set(quiet) <= names


def test_the_xid_rules_split_codes_as_the_xid_table_does() -> None:
    """Xid codes the job's own CUDA code causes (cuda_illegal_access in the table) warn; the rest page."""
    table = json.loads((files("trainguard") / "data" / "xids.json").read_text())
    from_application = {row["xid"] for row in table["xids"] if row["cause"] == "cuda_illegal_access"}
    alerts = {a["alert"]: a["expr"] for a in _alerts()}
    for name, operator in [("TrainguardGpuXid", "!~"), ("TrainguardGpuXidFromApplication", "=~")]:
        codes = re.findall(rf'code{operator}"([0-9|]+)"', alerts[name])
        assert codes and all({int(c) for c in found.split("|")} == from_application for found in codes), name


def test_rules_and_dashboard_use_only_metrics_the_exporter_serves(tmp_path: Path) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TrainguardCollector(Registry(tmp_path / "state"), xid_counts=Counter))
    served = {
        line.split(" ")[2] for line in generate_latest(registry).decode().splitlines() if line.startswith("# TYPE")
    }
    served |= {name + "_total" for name in served}
    dashboard = json.loads(DASHBOARD.read_text())
    texts = [RULES.read_text()] + [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for text in texts for name in re.findall(r"\btrainguard_[a-z_]+", text)}
    assert "trainguard_run_checkpoint_interval_seconds" in used and "trainguard_run_end_time_seconds" in used
    assert used <= served, used - served


@pytest.mark.parametrize("page", ["docs/monitoring.md", "docs/monitoring.zh-CN.md"])
def test_the_monitoring_page_shows_the_example_node_list_and_every_rule(page: str) -> None:
    text = (EXAMPLE_CONFIG.parents[1] / page).read_text()
    shown = re.search(r"```yaml\n\s*# /etc/prometheus/trainguard-nodes.yml\n(.*?)```", text, re.S)
    assert shown, f"{page} shows the node list"
    example = yaml.safe_load((EXAMPLE_CONFIG.parent / "trainguard-nodes.yml").read_text())
    assert yaml.safe_load(textwrap.dedent(shown.group(1))) == example
    assert all(f"| {alert['alert']} | {alert['labels']['severity']} |" in text for alert in _alerts())
