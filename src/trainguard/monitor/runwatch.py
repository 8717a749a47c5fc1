"""Monitoring one run from its supervisor: samples on a schedule, stored (thinned with age) in the
registry, alert rules over them with one alert per episode, notifiers for alerts and deaths, and the
last samples before a death as evidence for its diagnosis."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from trainguard.diagnosis.evidence import KernelLine, Observation, xid_lines
from trainguard.diagnosis.signatures import Role, lookup_xid
from trainguard.monitor.alerts import Alert, Episodes, evaluate
from trainguard.monitor.notify import Notifier
from trainguard.monitor.sampler import Sample, Sampler
from trainguard.probes import kernel_log
from trainguard.store.journal import Journal

log = logging.getLogger("trainguard.monitor")

WINDOW_S = 15 * 60  # samples kept in memory for trends
DOWNSAMPLE_EVERY_S = 300
XID_EVERY_S = 30  # how often the kernel log is read for new Xid errors
EVIDENCE_MAX_AGE_S = 30  # a sample older than this before a death says nothing about it


def telemetry_observations(samples: Sequence[Sample], death_time: float) -> list[Observation]:
    """What the last sample before a death says about it (pure)."""
    before = [s for s in samples if s.time <= death_time + 1 and death_time - s.time <= EVIDENCE_MAX_AGE_S]
    if not before:
        return []
    last = before[-1]
    ago = max(0.0, death_time - last.time)
    found = []

    def add(cause: str, weight: float, text: str) -> None:
        found.append(Observation(source="telemetry", cause=cause, weight=weight, role=Role.SUPPORT,
                                 rule=f"telemetry:{cause}", text=f"{text}, {ago:.0f} s before the death"))  # fmt: skip

    if last.mem_available is not None and last.mem_total and last.mem_available / last.mem_total < 0.03:
        add("host_oom", 0.6, f"RAM {100 * (1 - last.mem_available / last.mem_total):.0f}% used "
                              f"({last.mem_available / 2**30:.2f} GiB left)")  # fmt: skip
    if last.shm_used is not None and last.shm_total and last.shm_used / last.shm_total >= 0.95:
        add("shm_exhausted", 0.5, f"/dev/shm {100 * last.shm_used / last.shm_total:.0f}% full")
    for path, free in last.disk_free.items():
        if free < 64 * 2**20:
            add("disk_full", 0.5, f"{path}: {free / 2**20:.0f} MiB free")
    for gpu in last.gpus:
        # PyTorch's caching allocator keeps memory reserved, so a full GPU is only a hint.
        if gpu.memory_total and gpu.memory_used / gpu.memory_total >= 0.97:
            add("cuda_oom", 0.3, f"GPU {gpu.index} memory {100 * gpu.memory_used / gpu.memory_total:.0f}% used")
    return found


class RunMonitor:
    def __init__(
        self,
        journal: Journal,
        *,
        interval_s: float,
        disk_paths: list[str],
        notifiers: Sequence[Notifier],
        checkpoint_bytes: Callable[[], int | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.journal = journal
        self.run_id = journal.run.id
        self.interval_s = interval_s
        self.sampler = Sampler(disk_paths=disk_paths)
        self.notifiers = list(notifiers)
        self.checkpoint_bytes = checkpoint_bytes
        self.clock = clock
        self.recent: deque[Sample] = deque()
        self.episodes = Episodes()
        # The first readings wait a moment: a job that dies at once is not kept waiting on them, and
        # NVML is started now, before any job runs.
        self._next_sample = clock() + min(interval_s, 1.0)
        self._next_downsample = clock() + DOWNSAMPLE_EVERY_S
        self._next_xid = clock() + XID_EVERY_S
        self.sampler.warm_up()
        self._started = time.time()
        self._seen_xids: set[str] = set()

    def tick(self, job_pid: int | None) -> None:
        now = self.clock()
        if now < self._next_sample:
            return
        self._next_sample = now + self.interval_s
        self.sample_now(job_pid)
        if now >= self._next_downsample:
            self._next_downsample = now + DOWNSAMPLE_EVERY_S
            self.journal.downsample(self.run_id, time.time())
        if now >= self._next_xid:
            self._next_xid = now + XID_EVERY_S
            self.check_xids()

    def check_xids(self, lines: Sequence[KernelLine] | None = None) -> None:
        """Alert once for each Xid line the kernel logged since the run started."""
        if lines is None:
            try:
                lines, _ = kernel_log.read_live()
            except kernel_log.KernelLogUnavailable:
                return
        for code, line in xid_lines(lines):
            if (line.time is not None and line.time < self._started) or line.text in self._seen_xids:
                continue
            self._seen_xids.add(line.text)
            info = lookup_xid(code)
            severity = "critical" if info.cause == "gpu_hardware" and info.weight >= 0.8 else "warning"
            self.alert("new_xid", severity, en=f"Xid {info.xid} ({info.name}): {info.action} — {line.text}",
                       zh=f"Xid {info.xid}（{info.name}）：{line.text}")  # fmt: skip

    def sample_now(self, job_pid: int | None) -> Sample:
        sample = self.sampler.sample(job_pid)
        self.recent.append(sample)
        while self.recent and sample.time - self.recent[0].time > WINDOW_S:
            self.recent.popleft()
        self.journal.add_sample(self.run_id, sample.time, sample.to_dict())
        for alert in self.episodes.update(evaluate(list(self.recent), checkpoint_bytes=self.checkpoint_bytes())):
            self.alert(alert.rule, alert.severity, alert)
        for rule, key in self.episodes.ended:  # what the view shows as standing clears with its condition
            self.journal.event("alert_cleared", {"rule": rule, "key": key})
        return sample

    def alert(self, rule: str, severity: str, alert: Alert | None = None, *, en: str = "", zh: str = "") -> None:
        """Record and send an alert: of a condition's episode (``alert``, with its key), or of an event."""
        en, zh = (alert.en, alert.zh) if alert else (en, zh)
        record = {"rule": rule, "severity": severity, "message": en, "message_zh": zh}
        self.journal.event("alert", {**record, "key": alert.key} if alert else record)
        run = self.journal.run
        for notifier in self.notifiers:
            text = zh if notifier.lang == "zh" else en
            label = f"{run.name} ({run.id})" if run.name else run.id
            where = f"运行 {label}（{run.host}）" if notifier.lang == "zh" else f"run {label} on {run.host}"
            title = f"{rule} · {where}"
            message = {"run": run.id, "name": run.name, "host": run.host, "rule": rule, "severity": severity,
                       "title": title, "text": text}  # fmt: skip
            notifier.send({**message, "time": time.time()})

    def evidence(self, death_time: float) -> list[Observation]:
        return telemetry_observations(list(self.recent), death_time)
