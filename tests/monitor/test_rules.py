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
