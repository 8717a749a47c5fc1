"""Why did it die: gathers the evidence about a dead job (its logs, the kernel log, its exit status)
and asks the pure classifier. The supervisor and ``trainguard diagnose`` both call this."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from trainguard import causes
from trainguard._i18n import Text
from trainguard.diagnosis import ranks
from trainguard.diagnosis.classify import Diagnosis, classify
from trainguard.diagnosis.evidence import (
    ExitStatus,
    KernelLine,
    Observation,
    observations_from_exit,
    observations_from_kernel,
    observations_from_log,
    pids_in,
)
from trainguard.diagnosis.scan import Scanner
from trainguard.diagnosis.signatures import Role, SignatureTable, default_table
from trainguard.paths import cache_dir


@dataclass(frozen=True)
class LogSource:
    name: str | None  # shown beside the evidence when several logs are judged together
    blocks: Iterable[bytes]


@dataclass(frozen=True)
class Report:
    diagnosis: Diagnosis
    lines_scanned: int
    bytes_scanned: int
    engine: str
    first_failure: dict[str, Any] | None = None  # {"rank", "host", "time", "file"} where the logs say


@cache
def default_scanner() -> Scanner:
    return Scanner(default_table().signatures, cache_dir=cache_dir())


def investigate(
    logs: Sequence[LogSource],
    *,
    exit_status: ExitStatus | None = None,
    kernel_lines: Sequence[KernelLine] = (),
    job_pids: Iterable[int] | None = None,
    extra: Sequence[Observation] = (),
    scanner: Scanner | None = None,
    table: SignatureTable | None = None,
    kernel_readable: bool = False,
) -> Report:
    """``kernel_readable``: the kernel log of the time of death was read (it is in
    ``kernel_lines``, whatever it holds). A SIGKILL with no OOM kill of the job in a readable kernel
    log was sent by someone: ``killed``, not ``host_oom``."""
    scanner = scanner or default_scanner()
    table = table or default_table()
    observations: list[Observation] = list(extra)
    mentioned: set[int] = set()
    lines = size = 0
    for index, log in enumerate(logs):
        result = scanner.scan(log.blocks)
        lines += result.lines
        size += result.bytes
        observations += observations_from_log(result.matches, file=log.name, file_index=index)
        mentioned |= pids_in(result.matches)
    observations += observations_from_exit(exit_status, table.exit_rules)
    observations += observations_from_kernel(
        kernel_lines,
        table.signatures,
        job_pids=set(job_pids) if job_pids is not None else None,
        mentioned_pids=mentioned,
    )
    if kernel_readable:
        observations = sigkill_without_oom_is_killed(observations)
    diagnosis = classify(observations)
    names = [log.name for log in logs]
    return Report(diagnosis, lines, size, scanner.engine, first_failure(diagnosis.cause, observations, names))


def sigkill_without_oom_is_killed(observations: list[Observation]) -> list[Observation]:
    """Read every SIGKILL as ``killed`` when the kernel (or the job's cgroup) recorded no OOM kill
    that could be the job's: the OOM killer always leaves a record, so someone else sent it."""
    oom_recorded = any(
        o.cause == "host_oom" and o.source in ("kernel", "telemetry") and o.weight > 0 and o.role is not Role.SUPPORT
        for o in observations
    )
    if oom_recorded:
        return observations
    note = Text("a readable kernel log holds no OOM kill of the job: the SIGKILL came from outside",
                "内核日志可读，且没有作业被 OOM 杀死的记录：SIGKILL 来自外部")
    return [replace(o, cause="killed", note=o.note or note) if o.sigkill else o for o in observations]


def first_failure(
    cause: str, observations: Sequence[Observation], names: Sequence[str | None]
) -> dict[str, Any] | None:
    """Where the diagnosed cause struck first: the rank (and host) whose line of that cause carries the
    earliest timestamp, across every rank's log (or the ranks' prefixes inside one log)."""
    candidates = []
    for obs in observations:
        if obs.cause != cause or obs.source != "log" or obs.line is None or obs.role is Role.WRAPPER:
            continue
        file_index = obs.order[0]
        name = names[file_index] if 0 <= file_index < len(names) else None
        rank = ranks.line_rank(obs.text)
        if rank is None:
            rank = ranks.name_rank(name)
        stamp = ranks.line_time(obs.text)
        candidates.append((stamp.key if stamp else float("inf"), obs.order, obs, rank, stamp, name))
    if not candidates:
        return None
    _key, _order, obs, rank, stamp, name = min(candidates, key=lambda c: (c[0], c[1]))
    host = ranks.line_host(obs.text)
    if rank is None and host is None and (stamp is None or len(names) < 2):
        return None  # one log and nothing to tell ranks apart: there is no "first" to name
    found: dict[str, Any] = {"rank": rank, "host": host, "time": stamp.text if stamp else None}
    if name:
        found["file"] = name
    return found


def _evidence_json(obs: Observation, lang: str) -> dict[str, Any]:
    item: dict[str, Any] = {"source": obs.source, "line": obs.line, "text": obs.text}
    if obs.file is not None:
        item["file"] = obs.file
    if obs.note is not None:
        item["note"] = obs.note.pick(lang)
    return item


def diagnosis_dict(diagnosis: Diagnosis, lang: str, first: dict[str, Any] | None = None) -> dict[str, Any]:
    cause = causes.get(diagnosis.cause)
    found = {
        "cause": diagnosis.cause,
        "confidence": diagnosis.confidence,
        "title": cause.title_in(lang),
        "evidence": [_evidence_json(o, lang) for o in diagnosis.evidence],
        "fixes": list(cause.fixes_in(lang)),
        "alternatives": [{"cause": c, "confidence": conf} for c, conf in diagnosis.alternatives],
    }
    if first is not None:
        found["first_failure"] = first
    return found
