"""What `trainguard top` shows, as plain values, and the decisions behind them (PURE: no I/O, no
clock): a run's row from its records, which run a GPU process belongs to, the names of throttle
reasons. ``collect`` fills these from the registry, NVML and /proc."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.store.states import PUBLIC_STATE, TERMINAL_STATES, RunState

# NVML clocks-event reasons (tools/reference/nvml_throttle.json); gpu_idle is no throttle.
THROTTLE_REASONS = {
    0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}  # fmt: skip
# The cgroup each attempt runs in is named after its run and attempt (supervisor.containment).
_ATTEMPT_CGROUP = re.compile(r"trainguard-([0-9a-f]{8})-(\d+)\b")


@dataclass(frozen=True)
class RunView:
    id: str
    name: str | None
    state: str  # running | restarting | succeeded | failed | stopped
    active: bool
    attempt: int | None
    since_s: float | None  # active: how long the current attempt has run; ended: since the run ended
    step: int | None
    step_from: str | None  # "job" (what it reported) | "checkpoint" (the newest checkpoint's step)
    steps_per_s: float | None
    checkpoint_age_s: float | None
    rss: int | None  # bytes, the job's process tree
    limit: int | None  # bytes: --memory-limit, else the memory the machine (or container) has
    limit_is_own: bool  # True: the run's --memory-limit
    alert: str | None
    alert_age_s: float | None
    last_cause: str | None
    goodput: float | None


@dataclass(frozen=True)
class GpuProcessView:
    pid: int
    used: int | None  # bytes of GPU memory, None when NVML cannot say
    command: str | None
    run_id: str | None
    run_name: str | None


@dataclass(frozen=True)
class GpuView:
    index: int
    name: str | None
    memory_used: int
    memory_total: int
    utilization: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    throttle: tuple[str, ...]
    processes: tuple[GpuProcessView, ...] = ()


@dataclass(frozen=True)
class DiskView:
    label: str  # what the folder is: "state", a run's checkpoints
    path: str
    free: int
    total: int


@dataclass(frozen=True)
class HostView:
    mem_total: int | None = None
    mem_available: int | None = None
    swap_total: int | None = None
    swap_used: int | None = None
    shm_total: int | None = None
    shm_used: int | None = None
    disks: tuple[DiskView, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    time: float
    runs: tuple[RunView, ...]
    gpus: tuple[GpuView, ...]
    host: HostView
    gpu_note: str | None = None  # why there is no GPU panel: no NVML, no GPU
    hostname: str = ""
    state_dir: str = ""
    errors: tuple[str, ...] = field(default_factory=tuple)


def throttle_names(reasons: int | None) -> tuple[str, ...]:
    if not reasons:
        return ()
    return tuple(name for bit, name in THROTTLE_REASONS.items() if reasons & bit)


def owner_of(
    cgroup_text: str | None, ancestors: Sequence[int], job_pids: Mapping[int, str]
) -> tuple[str, int] | tuple[str, None] | None:
    """Which run a process belongs to: the attempt cgroup it sits in (``/proc/PID/cgroup``), else an
    ancestor that is a run's job (``job_pids``: pid -> run id). (run id, attempt or None), or None."""
    if cgroup_text:
        found = _ATTEMPT_CGROUP.search(cgroup_text)
        if found:
            return found.group(1), int(found.group(2))
    for pid in ancestors:
        if pid in job_pids:
            return job_pids[pid], None
    return None


def steps_per_second(reported: Mapping[str, Any]) -> float | None:
    try:
        steps = float(reported["step"]) - float(reported["first_step"])
        seconds = float(reported["step_time"]) - float(reported["first_step_time"])
    except (KeyError, TypeError, ValueError):
        return None
    return steps / seconds if steps > 0 and seconds > 0 else None


def run_view(
    run: Any,
    *,
    now: float,
    reported: Mapping[str, Any] | None,
    newest_checkpoint: Mapping[str, Any] | None,
    rss: int | None,
    machine_memory: int | None,
    alert: Mapping[str, Any] | None,
    goodput: float | None,
    lang: str = "en",
) -> RunView:
    """One run's row. ``reported``: what its current attempt's job reported (fresher than the
    registry's copy while it runs); ``newest_checkpoint``: its newest checkpoint event."""
    state = RunState(run.state)
    active = state not in TERMINAL_STATES
    current = run.attempts[-1] if run.attempts else None
    reported = reported or (current.progress if current else None) or {}
    if active:
        since = now - current.started_at if current is not None and current.ended_at is None else None
    else:
        ended = current.ended_at if current is not None else None
        since = now - ended if ended is not None else None
    step, step_from = None, None
    if isinstance(reported.get("step"), int):
        step, step_from = reported["step"], "job"
    elif newest_checkpoint is not None and isinstance(newest_checkpoint.get("step"), int):
        step, step_from = newest_checkpoint["step"], "checkpoint"
    own_limit = run.options.get("memory_limit")
    message = None
    if alert is not None:
        message = alert.get("message_zh") if lang == "zh" and alert.get("message_zh") else alert.get("message")
        message = message or alert.get("rule")
    died = [a for a in run.attempts if a.cause]
    return RunView(
        id=run.id,
        name=run.name,
        state=PUBLIC_STATE[state],
        active=active,
        attempt=current.n if current is not None else None,
        since_s=since,
        step=step,
        step_from=step_from,
        steps_per_s=steps_per_second(reported) if active else None,
        checkpoint_age_s=now - float(newest_checkpoint["time"]) if newest_checkpoint is not None else None,
        rss=rss if active else None,
        limit=own_limit or machine_memory,
        limit_is_own=bool(own_limit),
        alert=message,
        alert_age_s=now - float(alert["time"]) if alert is not None else None,
        last_cause=died[-1].cause if died else None,
        goodput=goodput,
    )


def order_runs(views: Iterable[RunView]) -> list[RunView]:
    """Active runs first (the longest running first), then ended ones, the most recent first."""
    views = list(views)
    active = sorted((v for v in views if v.active), key=lambda v: -(v.since_s or 0))
    ended = sorted((v for v in views if not v.active), key=lambda v: v.since_s if v.since_s is not None else 1e18)
    return active + ended
