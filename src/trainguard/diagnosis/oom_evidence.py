"""What the kernel's OOM counters say about a death, for a user who cannot read the kernel log: how
many OOM kills the machine (``/proc/vmstat``) and the job's memory cgroup counted between the
attempt's start and its death. Pure: the readings come in as numbers."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard._i18n import Text
from trainguard.diagnosis.evidence import Observation
from trainguard.diagnosis.signatures import Role


@dataclass(frozen=True)
class OomDeltas:
    """OOM kills counted during the attempt; None where a counter could not be read at both ends."""

    system: int | None
    cgroup: int | None
    cgroup_file: str | None = None


@dataclass(frozen=True)
class OomFindings:
    observations: tuple[Observation, ...]
    decided: bool  # the counters say whether the OOM killer struck the job: a SIGKILL without it came from outside
    reason: Text | None = None  # why a SIGKILL is then read as a kill from outside


def _counted(cause: str, weight: float, rule: str, text: str) -> Observation:
    return Observation(source="telemetry", cause=cause, weight=weight, role=Role.ROOT, rule=rule, text=text)


def _kills(n: int) -> str:
    return f"{n} OOM kill" + ("" if n == 1 else "s")


def judge_oom_counts(deltas: OomDeltas) -> OomFindings:
    if deltas.cgroup is not None and deltas.cgroup > 0:
        return OomFindings((_counted(
            "host_oom", 0.99, "counters:cgroup_oom_kill",
            f"the memory cgroup the job ran in counted {_kills(deltas.cgroup)} during the attempt "
            f"({deltas.cgroup_file})",
        ),), decided=True)  # fmt: skip
    if deltas.cgroup == 0:
        return OomFindings((), decided=True, reason=Text(
            f"the memory cgroup the job ran in counted no OOM kill during the attempt ({deltas.cgroup_file}): "
            "the SIGKILL came from outside",
            f"作业所在的内存 cgroup 在本次尝试期间没有 OOM 杀进程的记录（{deltas.cgroup_file}）：SIGKILL 来自外部",
        ))  # fmt: skip
    if deltas.system == 0:
        return OomFindings((), decided=True, reason=Text(
            "this machine counted no OOM kill during the attempt (/proc/vmstat oom_kill): "
            "the SIGKILL came from outside",
            "本机在本次尝试期间没有 OOM 杀进程的记录（/proc/vmstat oom_kill）：SIGKILL 来自外部",
        ))  # fmt: skip
    if deltas.system is not None and deltas.system > 0:
        return OomFindings((_counted(
            "host_oom", 0.6, "counters:system_oom_kill",
            f"this machine counted {_kills(deltas.system)} during the attempt (/proc/vmstat oom_kill): "
            "possibly of the job",
        ),), decided=False)  # fmt: skip
    return OomFindings((), decided=False)


# A SIGKILL whose sender nothing could tell: both readings stand, with how to decide.
SENDER_UNKNOWN = Observation(
    source="telemetry", cause="killed", weight=0.4, role=Role.ROOT, rule="supervisor:sigkill_sender_unknown",
    text="the job died of SIGKILL and nothing readable here says whether the OOM killer sent it",
    note=Text(
        "the kernel log could not be read (not root, or kernel.dmesg_restrict=1) and no OOM counter was readable: "
        "`sudo dmesg -T | grep -i -E 'out of memory|killed process'` (or your container's or scheduler's events) "
        "tells an OOM kill from a kill -9",
        "无法读取内核日志（非 root，或 kernel.dmesg_restrict=1），也读不到 OOM 计数：用 "
        "`sudo dmesg -T | grep -i -E 'out of memory|killed process'`（或容器、调度器的事件）区分 OOM 杀进程与 kill -9",
    ),
)  # fmt: skip
