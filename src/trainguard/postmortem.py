"""Why did it die: gathers the evidence about a dead job (its logs, the kernel log, its exit status)
and asks the pure classifier. The supervisor and ``trainguard diagnose`` both call this."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from trainguard import causes
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
from trainguard.diagnosis.signatures import SignatureTable, default_table
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
) -> Report:
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
    return Report(classify(observations), lines, size, scanner.engine)


def _evidence_json(obs: Observation) -> dict[str, Any]:
    item: dict[str, Any] = {"source": obs.source, "line": obs.line, "text": obs.text}
    if obs.file is not None:
        item["file"] = obs.file
    if obs.note is not None:
        item["note"] = obs.note
    return item


def diagnosis_dict(diagnosis: Diagnosis, lang: str) -> dict[str, Any]:
    cause = causes.get(diagnosis.cause)
    return {
        "cause": diagnosis.cause,
        "confidence": diagnosis.confidence,
        "title": cause.title_in(lang),
        "evidence": [_evidence_json(o) for o in diagnosis.evidence],
        "fixes": list(cause.fixes_in(lang)),
        "alternatives": [{"cause": c, "confidence": conf} for c, conf in diagnosis.alternatives],
    }
