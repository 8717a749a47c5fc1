"""The evidence about one dead attempt of a run: its part of the log (streamed), the error file the
training library wrote, the kernel log around its death, its exit status, and whether the supervisor
found it hung; for a launcher's job (torchrun, DeepSpeed, Accelerate) also every rank's output and
error files and the launcher's failure summary, so that each rank is judged on its own lines. Used by
the supervisor after each death and by ``trainguard diagnose RUN``."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from typing import Any

from trainguard import _untrusted as untrusted
from trainguard.diagnosis import launch
from trainguard.diagnosis.evidence import ExitStatus, Observation
from trainguard.diagnosis.oom_evidence import OomDeltas
from trainguard.diagnosis.scan import read_blocks
from trainguard.diagnosis.signatures import Role
from trainguard.postmortem import LogSource, Report, investigate
from trainguard.probes import kernel_log, oom_counters
from trainguard.store import runlogs
from trainguard.supervisor import launchers

KERNEL_SLACK_S = 5.0
SUMMARY_TAIL_BYTES = 256 * 1024  # torchrun prints its failure summary last
_RANK_SUFFIX = re.compile(r"\.rank([0-9]+)$")


def _log_region(path: str, start: int, end: int | None) -> Iterator[bytes]:
    log = untrusted.open_regular(path)
    if log is None:
        return  # a log that someone removed (or a FIFO in its place) is no evidence, not a crash
    with log:
        log.seek(start)
        remaining = None if end is None else end - start
        for block in read_blocks(log):
            part = block if remaining is None else block[:remaining]
            if remaining is not None:
                remaining -= len(part)
            if part:
                yield part
            if remaining is not None and remaining <= 0:
                return


def _attempt_log(path: str, start: int, end: int | None, bounded_log: str | None) -> Iterator[bytes]:
    """The attempt's output as kept: the head and backups of a rotated log, then its live file; a
    line break between pieces, so that no two lines of either side of a cut are read as one."""
    earlier = runlogs.kept_files(bounded_log)[:-1] if bounded_log else []
    for piece in earlier:
        yield from _log_region(piece, 0, None)
        yield b"\n"
    yield from _log_region(path, start, end)


def error_file_text(path: str) -> str | None:
    """The exception the training library wrote (``{"type", "message", ...}``), as a log line."""
    payload = untrusted.load_object(path, untrusted.MAX_ERROR_FILE_BYTES)
    if payload is None:
        return None
    kind, message = payload.get("type"), payload.get("message")
    if not (isinstance(kind, str) and isinstance(message, str)):
        untrusted.warn_once(path, "no exception type and message")
        return None
    return f"{kind}: {message}\n"


def attempt_report(
    log_path: str | None,
    *,
    log_start: int,
    log_end: int | None,
    exit_status: ExitStatus | None,
    started: float,
    ended: float,
    pids: set[int],
    error_file: str | None,
    hang_timeout_s: float | None = None,
    extra: list[Observation] | None = None,
    kernel_tail: kernel_log.KernelTail | None = None,
    oom_deltas: OomDeltas | None = None,
    bounded_log: str | None = None,
) -> Report:
    """``oom_deltas``: the OOM kills counted during the attempt (``count_oom_kills`` at its death),
    which say whether the OOM killer struck where the kernel log cannot be read. ``bounded_log``: the
    attempt's log as recorded, whose rotated pieces (its head, its backups) are read before
    ``log_path``, the live file."""
    extra = list(extra or [])
    if hang_timeout_s is not None:
        extra.append(
            Observation(
                source="telemetry",
                cause="hang",
                weight=0.99,
                role=Role.ROOT,
                rule="supervisor:hang",
                text=f"no new output and no new checkpoint for {hang_timeout_s:g} s",
            )
        )
    sources = [LogSource(None, _attempt_log(log_path, log_start, log_end, bounded_log))] if log_path else []
    record = launchers.read_record(launch_record_path(error_file)) if error_file else None
    facts = None
    if record is not None and log_path:
        facts, rank_sources = _launch_evidence(record, log_path, log_start, log_end, error_file, started)
        sources += rank_sources
    else:
        error_text = error_file_text(error_file) if error_file else None
        if error_text:
            sources.append(LogSource("error file", [error_text.encode()]))
    try:
        lines = kernel_tail.read_new() if kernel_tail is not None else kernel_log.read_live()[0]
        window = kernel_log.in_window(lines, started - KERNEL_SLACK_S, ended + KERNEL_SLACK_S)
        kernel_lines = [line for line in window if line.time is not None]
        kernel_readable = True
    except kernel_log.KernelLogUnavailable:
        kernel_lines, kernel_readable = [], False
    return investigate(sources, exit_status=exit_status, kernel_lines=kernel_lines, job_pids=pids, extra=extra,
                       kernel_readable=kernel_readable, launch=facts, oom_deltas=oom_deltas)  # fmt: skip


def count_oom_kills(before: oom_counters.OomCounts) -> OomDeltas:
    """The OOM kills counted since ``before``, on the machine and in the same memory cgroup."""
    after = oom_counters.read(cgroup_file=before.cgroup_path) if before.cgroup_path else oom_counters.read()

    def delta(start: int | None, end: int | None) -> int | None:
        return end - start if start is not None and end is not None and end >= start else None

    return OomDeltas(delta(before.system, after.system), delta(before.cgroup, after.cgroup), before.cgroup_path)


def launch_record_path(error_file: str) -> str:
    """The launcher record of the attempt whose error file this is (``attempt-N.launch.json``)."""
    return error_file.removesuffix(".error.json") + ".launch.json"


def _tail(path: str, start: int, end: int | None) -> str:
    log = untrusted.open_regular(path)
    if log is None:
        return ""
    try:
        with log:
            stop = end if end is not None else log.seek(0, os.SEEK_END)
            log.seek(max(start, stop - SUMMARY_TAIL_BYTES))
            return log.read(stop - log.tell()).decode("utf-8", "replace")
    except OSError:
        return ""


def _launch_evidence(
    record: dict[str, Any], log_path: str, log_start: int, log_end: int | None, error_file: str | None, started: float
) -> tuple[launch.LaunchFacts, list[LogSource]]:
    """The launcher's view of the attempt: its failure summary, which worker was which rank, and a
    source per rank's file (its output, torchrun's error.json, trainguard's error file)."""
    workers = record.get("workers")
    global_ranks = {
        w["local_rank"]: w["rank"]
        for w in (workers.values() if isinstance(workers, dict) else ())
        if isinstance(w, dict) and untrusted.is_int(w.get("local_rank")) and untrusted.is_int(w.get("rank"))
    }
    hung = record.get("hung_ranks")
    host = record.get("host")
    facts = launch.LaunchFacts(
        failures=launch.parse_torchrun_summary(_tail(log_path, log_start, log_end)),
        global_ranks=global_ranks or None,
        hung_ranks=tuple(r for r in hung if untrusted.is_int(r)) if isinstance(hung, list) else (),
        host=host if isinstance(host, str) else None,
    )

    def rank_of(local: int) -> int:
        mapped = facts.global_rank(local)
        return mapped if mapped is not None else local

    sources: list[LogSource] = []
    seen: set[str] = set()
    log_dirs = record.get("log_dirs")
    log_dirs = [d for d in log_dirs if isinstance(d, str)] if isinstance(log_dirs, list) else []
    for found in launchers.rank_files(log_dirs, since=started):
        seen.add(os.path.realpath(found.path))
        if found.kind == "error":
            text = launchers.torch_error_text(found.path)
            if text:
                sources.append(LogSource(found.path, [text.encode()], rank=rank_of(found.local_rank)))
        else:
            sources.append(LogSource(found.path, _log_region(found.path, 0, None), rank=rank_of(found.local_rank)))
    for failure in facts.failures:  # error files the summary names elsewhere (accelerate: a temporary folder)
        if failure.error_file and os.path.realpath(failure.error_file) not in seen:
            text = launchers.torch_error_text(failure.error_file)
            if text:
                sources.append(LogSource(failure.error_file, [text.encode()], rank=failure.rank))
    if error_file:
        for path in [error_file, *sorted(glob.glob(glob.escape(error_file) + ".rank*"))]:
            text = error_file_text(path)
            suffix = _RANK_SUFFIX.search(path)
            if text:
                rank = int(suffix.group(1)) if suffix else 0
                sources.append(LogSource(f"error file (rank {rank})", [text.encode()], rank=rank))
    agent = record.get("launcher_error_file")
    first = facts.first_failure
    # Else the agent's file is a copy of that rank's error.json.
    if isinstance(agent, str) and agent and not (first is not None and first.error_file):
        text = launchers.torch_error_text(agent)
        if text:
            sources.append(LogSource("launcher error file", [text.encode()]))
    return facts, sources
