"""Naming an attempt's death: what only the supervisor saw (other nodes that never came, its
cgroup's OOM kills, a job that stopped by itself on a signal, the run's samples) goes with the
attempt's log to the autopsy; and how far the attempt got, for the crash-loop guard."""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from trainguard.diagnosis.evidence import ExitStatus, Observation
from trainguard.diagnosis.oom_evidence import OomDeltas
from trainguard.diagnosis.scan import read_blocks
from trainguard.diagnosis.signatures import Role
from trainguard.monitor.runwatch import RunMonitor
from trainguard.postmortem import diagnosis_dict
from trainguard.probes import oom_counters
from trainguard.store.registry import Attempt
from trainguard.supervisor.attempt_files import error_file
from trainguard.supervisor.autopsy import attempt_report, count_oom_kills
from trainguard.supervisor.job import JobOptions
from trainguard.supervisor.policy import STARTUP_LINES

if TYPE_CHECKING:
    from trainguard.supervisor.watch import AttemptWatch


def name_the_death(
    watch: AttemptWatch,
    returncode: int | None,
    status: ExitStatus | None,
    *,
    stopped: bool,
    oom_kills: int,
    monitor: RunMonitor,
    options: JobOptions,
    run_dir: str,
) -> None:
    """The attempt's cause, confidence and diagnosis; none for a job that finished or was stopped
    on request."""
    attempt = watch.attempt
    leak = _planned_leak_stop(watch) if not stopped else []
    stopped_itself = _stopped_on_signal(attempt) if returncode == 0 and not stopped and not leak else None
    if (returncode == 0 and stopped_itself is None and not leak) or stopped:
        attempt.cause = None
        return
    extra = [stopped_itself] if stopped_itself else []
    extra += leak
    diagnosis = _diagnose(watch, status, oom_kills, extra, monitor=monitor, options=options, run_dir=run_dir)
    attempt.cause = diagnosis["cause"]
    attempt.confidence = diagnosis["confidence"]
    attempt.diagnosis = diagnosis


def count_lines(watch: AttemptWatch, enough: int = STARTUP_LINES + 1) -> int:
    """New lines of the attempt, counted only as far as the crash-loop guard needs to know."""
    if watch.log_path is None:
        return 0
    count = 0
    with contextlib.suppress(OSError), open(watch.log_path, "rb") as log:
        log.seek(watch.attempt.log_offset)
        for block in read_blocks(log, 64 * 1024):
            count += block.count(b"\n")
            if count >= enough:
                break
    return count


def _stopped_on_signal(attempt: Attempt) -> Observation | None:
    """A job that saved and left its loop because a signal asked it to (a scheduler's SIGTERM, a
    pre-timeout SIGUSR1) exits 0, but its training is not finished: that attempt was preempted."""
    signum = (attempt.progress or {}).get("stop_signal")
    if not signum:
        return None
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    step = (attempt.progress or {}).get("step")
    at_step = f" at step {step}" if step is not None else ""
    return _seen_by_the_supervisor(
        "preempted", 0.95, "progress:stopped_on_signal",
        f"the job received {name}, saved{at_step} and stopped by itself (exit 0): it was asked to stop from "
        "outside trainguard",
    )  # fmt: skip


def _planned_leak_stop(watch: AttemptWatch) -> list[Observation]:
    """What the look ahead saw of a leak: the job saved and stopped as it was asked (a planned
    restart, ``memory_leak``), or it did not and met its limit (support for ``host_oom``)."""
    foresight = watch.foresight
    if foresight is None or foresight.planned_stop is None:
        return []
    report = watch.attempt.progress or {}
    evidence = foresight.planned_stop.leak.evidence
    if foresight.planned_stop_done(report) is None:
        return [Observation(source="telemetry", cause="host_oom", weight=0.5, role=Role.SUPPORT,
                            rule="supervisor:leak_seen", text=f"the job's memory was leaking: {evidence}")]  # fmt: skip
    step = report.get("save_request_step")
    at_step = f" at step {step}" if step is not None else ""
    return [_seen_by_the_supervisor(
        "memory_leak", 0.99, "supervisor:memory_leak",
        f"{evidence}; asked to save and stop before its limit, the job saved{at_step} and stopped: restarted fresh "
        "from that checkpoint",
    )]  # fmt: skip


def _diagnose(
    watch: AttemptWatch,
    status: ExitStatus | None,
    oom_kills: int,
    extra: list[Observation],
    *,
    monitor: RunMonitor,
    options: JobOptions,
    run_dir: str,
) -> dict:
    attempt = watch.attempt
    extra = monitor.evidence(attempt.ended_at or time.time()) + extra
    if watch.peers_missing:
        extra.append(_seen_by_the_supervisor(
            "peer_failure", 0.99, "supervisor:peers_missing",
            f"the other nodes of the job did not join the launcher's rendezvous within {options.peer_timeout_s:g} s "
            "(--peer-timeout)",
        ))  # fmt: skip
    if oom_kills:
        limit = (options.memory_limit or 0) / 1024**3
        extra.append(_seen_by_the_supervisor(
            "host_oom", 0.99, "cgroup:oom_kill",
            f"the kernel OOM-killed {oom_kills} process(es) in the job's memory cgroup ({limit:.2f} GiB limit)",
        ))  # fmt: skip
    oom_deltas = _oom_kills_meanwhile(attempt)
    report = attempt_report(
        watch.log_path,
        log_start=attempt.log_offset,
        log_end=None,
        exit_status=None if watch.hung or watch.peers_missing else status,
        started=attempt.started_at,
        ended=attempt.ended_at or time.time(),
        pids=watch.pids | {attempt.pid or 0},
        error_file=error_file(run_dir, attempt.n),
        hang_timeout_s=options.hang_timeout_s if watch.hung else None,
        extra=extra,
        kernel_tail=watch.kernel,
        oom_deltas=oom_deltas,
        bounded_log=attempt.log_path,
    )
    return diagnosis_dict(report.diagnosis, "en", report.first_failure)


def _oom_kills_meanwhile(attempt: Attempt) -> OomDeltas | None:
    """The OOM kills counted between the attempt's start and now, kept with the attempt so that
    `trainguard diagnose RUN` judges its death later by the same evidence."""
    record = (attempt.containment or {}).get("oom_counts")
    if not isinstance(record, dict):
        return None  # adopted from an older trainguard: nothing read at its start
    try:
        deltas = count_oom_kills(oom_counters.OomCounts(**record))
    except TypeError:
        return None
    attempt.containment = {**(attempt.containment or {}), "oom_deltas": asdict(deltas)}
    return deltas


def _seen_by_the_supervisor(cause: str, weight: float, rule: str, text: str) -> Observation:
    """Evidence the supervisor itself holds (the other nodes it waited for, its cgroup's OOM counter,
    the job's progress report)."""
    return Observation(source="telemetry", cause=cause, weight=weight, role=Role.ROOT, rule=rule, text=text)
