"""Alert rules, telemetry evidence and notifier payloads: pure functions over recorded samples."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse

import pytest

from trainguard.diagnosis.evidence import ExitStatus
from trainguard.monitor.alerts import Episodes, evaluate, host_memory_runout_s
from trainguard.monitor.notify import Notifier, parse_notifier
from trainguard.monitor.runwatch import telemetry_observations
from trainguard.monitor.sampler import GpuSample, Sample
from trainguard.postmortem import LogSource, investigate

GIB = 1024**3


def sample(t: float, **fields) -> Sample:
    base = {"mem_available": 100 * GIB, "mem_total": 128 * GIB, "shm_used": 0, "shm_total": 16 * GIB,
            "disk_free": {"/ckpt": 500 * GIB}}  # fmt: skip
    base.update(fields)
    return Sample(time=t, **base)


def rules(samples, **kwargs) -> set[str]:
    return {a.rule for a in evaluate(samples, **kwargs)}


def test_quiet_samples_raise_nothing() -> None:
    assert rules([sample(0), sample(5)]) == set()


def test_each_rule_on_its_condition() -> None:
    full_gpu = GpuSample(index=0, memory_used=79 * GIB, memory_total=80 * GIB, temperature_c=70, throttle_reasons=0)
    hot_gpu = GpuSample(index=1, memory_used=1, memory_total=80 * GIB, temperature_c=88, throttle_reasons=0x40)
    assert rules([sample(0, gpus=(full_gpu, hot_gpu))]) == {"gpu_memory_near_cap", "gpu_hot_or_throttled"}
    assert rules([sample(0, mem_available=2 * GIB)]) == {"host_memory_low"}
    assert rules([sample(0, shm_used=15 * GIB)]) == {"shm_near_full"}
    assert rules([sample(0, disk_free={"/ckpt": 20 * GIB})], checkpoint_bytes=30 * GIB) == {"disk_low"}


def test_host_memory_is_projected_from_its_trend() -> None:
    falling = [sample(t, mem_available=(60 - t / 10) * GIB) for t in range(0, 120, 10)]  # -0.1 GiB/s
    assert 400 < host_memory_runout_s(falling) < 600
    assert "host_memory_trend" in rules(falling)
    steady = [sample(t) for t in range(0, 120, 10)]
    assert host_memory_runout_s(steady) is None


def test_an_alert_fires_once_per_episode() -> None:
    episodes = Episodes()
    low = evaluate([sample(0, mem_available=GIB)])
    assert [a.rule for a in episodes.update(low)] == ["host_memory_low"]
    assert episodes.update(low) == []  # still the same episode
    assert episodes.update([]) == []  # cleared
    assert [a.rule for a in episodes.update(low)] == ["host_memory_low"]  # a new episode


def test_ram_at_the_limit_before_a_sigkill_makes_host_oom_stronger() -> None:
    death = 1000.0
    samples = [sample(death - 3, mem_available=GIB // 2)]
    evidence = telemetry_observations(samples, death)
    assert [(o.cause, o.source) for o in evidence] == [("host_oom", "telemetry")]
    bare = investigate([LogSource(None, [b"step 100\n"])], exit_status=ExitStatus.from_number(137)).diagnosis
    with_samples = investigate([LogSource(None, [b"step 100\n"])], exit_status=ExitStatus.from_number(137),
                               extra=evidence).diagnosis  # fmt: skip
    assert bare.cause == with_samples.cause == "host_oom" and with_samples.confidence > bare.confidence
    assert telemetry_observations(samples, death + 300) == []  # too old to say anything


def test_dingtalk_and_feishu_signatures_follow_their_documentation() -> None:
    secret = "SECabc123"
    now = 1_700_000_000.123
    url, body = Notifier("dingtalk", "https://oapi.dingtalk.com/robot/send?access_token=T", secret).request(
        {"title": "death", "text": "host_oom"}, now
    )
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    stamp = query["timestamp"][0]
    expected = base64.b64encode(hmac.new(secret.encode(), f"{stamp}\n{secret}".encode(), hashlib.sha256).digest())
    assert stamp == "1700000000123" and query["sign"][0] == expected.decode()
    assert json.loads(body)["msgtype"] == "text"

    _, body = Notifier("feishu", "https://open.feishu.cn/open-apis/bot/v2/hook/X", secret).request(
        {"title": "t", "text": "x"}, now
    )
    payload = json.loads(body)
    string_to_sign = f"{payload['timestamp']}\n{secret}"
    assert payload["sign"] == base64.b64encode(hmac.new(string_to_sign.encode(), b"", hashlib.sha256).digest()).decode()
    assert payload["msg_type"] == "text"


def test_notifiers_never_describe_their_token() -> None:
    slack = parse_notifier("slack", "https://hooks.slack.com/services/T000/B000/XXXXSECRET")
    assert slack.describe() == "slack (hooks.slack.com)"
    wecom = parse_notifier("wecom", "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=SECRETKEY")
    assert "SECRETKEY" not in wecom.describe()


@pytest.mark.parametrize("url", ["ftp://x", "not a url", "https://", "hooks.slack.com/services/x"])
def test_invalid_webhook_urls_are_refused(url: str) -> None:
    from trainguard.errors import UsageError

    with pytest.raises(UsageError, match="invalid"):
        parse_notifier("slack", url)


def test_a_new_xid_during_the_run_alerts_once(tmp_path) -> None:
    from trainguard.diagnosis.evidence import KernelLine
    from trainguard.monitor.runwatch import RunMonitor
    from trainguard.store.journal import Journal
    from trainguard.store.registry import Registry

    registry = Registry(tmp_path)
    run = registry.create_run(["x"], name=None, cwd="/", options={})
    monitor = RunMonitor(Journal(registry, run), interval_s=5, disk_paths=[], notifiers=[])
    xid = KernelLine("NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                     time=monitor._started + 10)  # fmt: skip
    before_the_run = KernelLine("NVRM: Xid (PCI:0000:91:00): 48, old", time=monitor._started - 3600)
    monitor.check_xids([before_the_run, xid])
    monitor.check_xids([before_the_run, xid])
    alerts = [e for e in registry.events(run.id) if e["kind"] == "alert"]
    assert len(alerts) == 1 and alerts[0]["rule"] == "new_xid" and alerts[0]["severity"] == "critical"
    assert "GPU has fallen off the bus" in alerts[0]["message"]


# ------------------------------------------------------------------ which recorded alert still stands
# The events a real run recorded (`trainguard run -- python -m trainguard.demo.toyjob --steps 30
# --fault preempted --fault-step 10`: preempted at step 10, resumed, finished), paths shortened.
PREEMPTED_THEN_SUCCEEDED = [
    {"time": 542.72, "kind": "created", "command": ["python", "-m", "trainguard.demo.toyjob"]},
    {"time": 543.44, "kind": "attempt_started", "n": 1, "pid": 4885, "resumed_from": None},
    {"time": 543.45, "kind": "state:running", "reason": "attempt 1", "pid": 4885},
    {"time": 543.94, "kind": "checkpoint", "attempt": 1, "path": "ck/step-000000000004", "step": 4},
    {"time": 544.26, "kind": "checkpoint", "attempt": 1, "path": "ck/step-000000000010", "step": 10},
    {"time": 544.37, "kind": "attempt_ended", "n": 1, "exit_code": None, "signal": 15, "cause": "preempted", "confidence": 0.9},
    {"time": 544.39, "kind": "decision", "restart": True, "reason": "preempted: restarting", "delay_s": 2.0},
    {"time": 544.39, "kind": "alert", "rule": "death", "severity": "critical",
     "message": "attempt 1 died: preempted (0.90); preempted: restarting", "message_zh": "第 1 次尝试终止：preempted (0.90)；preempted：正在重启"},
    {"time": 544.39, "kind": "state:backoff", "reason": "preempted: restarting", "delay_s": 2.0},
    {"time": 546.41, "kind": "state:starting", "reason": None},
    {"time": 546.40, "kind": "attempt_started", "n": 2, "pid": 4918, "resumed_from": "ck/step-000000000010"},
    {"time": 546.41, "kind": "state:running", "reason": "attempt 2", "pid": 4918},
    {"time": 546.93, "kind": "checkpoint", "attempt": 2, "path": "ck/step-000000000015", "step": 15},
    {"time": 547.54, "kind": "checkpoint", "attempt": 2, "path": "ck/step-000000000027", "step": 27},
    {"time": 547.87, "kind": "attempt_ended", "n": 2, "exit_code": 0, "signal": None, "cause": None, "confidence": None},
    {"time": 547.89, "kind": "decision", "restart": False, "reason": "exited 0", "delay_s": 0.0},
    {"time": 547.89, "kind": "state:succeeded", "reason": "exited 0"},
]  # fmt: skip


def events_until(kind: str, nth: int = 1) -> list[dict]:
    """The recorded events up to (and with) the ``nth`` event of ``kind``."""
    seen = 0
    for i, event in enumerate(PREEMPTED_THEN_SUCCEEDED):
        seen += event["kind"] == kind
        if seen == nth:
            return PREEMPTED_THEN_SUCCEEDED[: i + 1]
    raise AssertionError(kind)


def test_a_death_alert_stands_until_a_later_attempt_progresses_and_never_after_the_run_ends() -> None:
    from trainguard.monitor.standing import standing_alert

    restarting = events_until("state:running", 2)  # attempt 2 has started, nothing saved yet
    assert standing_alert(restarting, now=547.0)["message"].startswith("attempt 1 died: preempted")
    assert standing_alert(events_until("checkpoint", 3), now=547.0) is None  # attempt 2 saved: recovered
    assert standing_alert(PREEMPTED_THEN_SUCCEEDED, now=600.0) is None  # the run succeeded
    # A later attempt that saves nothing trainguard sees has recovered once it has run long enough.
    assert standing_alert(restarting, now=546.40 + 299) is not None
    assert standing_alert(restarting, now=546.40 + 301) is None


def test_a_second_death_is_the_news_and_a_failed_run_keeps_no_alert() -> None:
    from trainguard.monitor.standing import standing_alert

    died_again = [
        *events_until("state:running", 2),
        {"time": 548.0, "kind": "attempt_ended", "n": 2, "exit_code": 1, "signal": None, "cause": "python_error"},
        {"time": 548.1, "kind": "alert", "rule": "death", "severity": "critical", "message": "attempt 2 died: python_error"},
    ]  # fmt: skip
    assert standing_alert(died_again, now=9999.0)["message"] == "attempt 2 died: python_error"
    failed = [*died_again, {"time": 548.2, "kind": "state:failed", "reason": "python_error: a restart cannot help"},
              {"time": 548.3, "kind": "alert", "rule": "run_failed", "severity": "critical", "message": "run failed"}]  # fmt: skip
    assert standing_alert(failed, now=9999.0) is None  # its state and cause say it; no alert stands
    restarted = [*failed, {"time": 700.0, "kind": "state:starting", "reason": None}]  # `trainguard restart`
    assert standing_alert(restarted, now=701.0) is None


def test_a_condition_alert_stands_until_its_episode_is_recorded_as_cleared() -> None:
    from trainguard.monitor.standing import standing_alert

    start = events_until("checkpoint", 1)
    ram = {
        "time": 544.0,
        "kind": "alert",
        "rule": "host_memory_low",
        "key": "host",
        "severity": "critical",
        "message": "RAM low",
    }
    gpu = {
        "time": 544.1,
        "kind": "alert",
        "rule": "gpu_hot_or_throttled",
        "key": "gpu0",
        "severity": "warning",
        "message": "GPU 0 hot",
    }
    both = [*start, ram, gpu]
    assert standing_alert(both, now=9999.0)["message"] == "GPU 0 hot"  # a condition is not cured by time
    gpu_cooled = [*both, {"time": 545.0, "kind": "alert_cleared", "rule": "gpu_hot_or_throttled", "key": "gpu0"}]
    assert standing_alert(gpu_cooled, now=9999.0)["message"] == "RAM low"  # the older one still stands
    assert standing_alert([*gpu_cooled, {"time": 546.0, "kind": "alert_cleared", "rule": "host_memory_low",
                                         "key": "host"}], now=9999.0) is None  # fmt: skip


def test_the_monitor_records_the_end_of_an_alert_episode(tmp_path) -> None:
    from trainguard.monitor.runwatch import RunMonitor
    from trainguard.monitor.standing import EVENT_KINDS, standing_alert
    from trainguard.store.journal import Journal
    from trainguard.store.registry import Registry

    registry = Registry(tmp_path)
    run = registry.create_run(["x"], name=None, cwd="/", options={})
    monitor = RunMonitor(Journal(registry, run), interval_s=5, disk_paths=[], notifiers=[])
    readings = iter([sample(0, mem_available=GIB), sample(5, mem_available=GIB), sample(10)])
    monitor.sampler.sample = lambda job_pid: next(readings)
    monitor.sample_now(None)
    assert standing_alert(registry.events(run.id, kinds=EVENT_KINDS), now=6)["rule"] == "host_memory_low"
    monitor.sample_now(None)
    assert monitor.episodes.ended == []
    monitor.sample_now(None)
    assert monitor.episodes.ended == [("host_memory_low", "host")]
    kinds = [(e["kind"], e.get("rule"), e.get("key")) for e in registry.events(run.id) if "alert" in e["kind"]]
    assert kinds == [("alert", "host_memory_low", "host"), ("alert_cleared", "host_memory_low", "host")]
    assert standing_alert(registry.events(run.id, kinds=EVENT_KINDS), now=11) is None
