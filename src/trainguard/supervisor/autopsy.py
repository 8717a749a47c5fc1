"""The evidence about one dead attempt of a run: its part of the log (streamed), the error file the
training library wrote, the kernel log around its death, its exit status, and whether the supervisor
found it hung. Used by the supervisor after each death and by ``trainguard diagnose RUN``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from trainguard.diagnosis.evidence import ExitStatus, Observation
from trainguard.diagnosis.scan import read_blocks
from trainguard.diagnosis.signatures import Role
from trainguard.postmortem import LogSource, Report, investigate
from trainguard.probes import kernel_log

KERNEL_SLACK_S = 5.0


def _log_region(path: str, start: int, end: int | None) -> Iterator[bytes]:
    try:
        log = open(path, "rb")  # noqa: SIM115 - closed below
    except OSError:
        return  # a log that someone removed is no evidence, not a crash
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


def error_file_text(path: str) -> str | None:
    try:
        payload = json.loads(Path(path).read_text())
        return f"{payload['type']}: {payload['message']}\n"
    except (OSError, ValueError, KeyError, TypeError):
        return None


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
) -> Report:
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
    sources = [LogSource(None, _log_region(log_path, log_start, log_end))] if log_path else []
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
                       kernel_readable=kernel_readable)  # fmt: skip
