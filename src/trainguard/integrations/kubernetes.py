"""Kubernetes: the verdict of a ``trainguard run --foreground`` in a pod's termination message.

The kubelet reads the file at ``terminationMessagePath`` (``/dev/termination-log`` by default) when
the container ends and shows it as ``status.containerStatuses[].state.terminated.message`` (and in
``kubectl describe pod``), cut at 4096 bytes. trainguard writes one JSON object there, made to fit:
exit code, state, cause, confidence, title, the deciding evidence line and the first fix.
``termination_message`` is pure; ``write_termination_log`` is the adapter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.causes import VERDICT_EXIT, Cause

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_BYTES = 4096  # the kubelet keeps no more of a container's termination message
ELLIPSIS = "…"
_SHRINKABLE = ("evidence", "fix", "title", "reason")  # cut in this order when the message is too long


def deciding_evidence(evidence: Sequence[Mapping[str, Any]]) -> str | None:
    """The line that decided the diagnosis, as a person reads it. The evidence comes in the order it
    happened (log, then kernel records, then the exit status); the deciding line is the latest one
    that is not the bare exit status: the kernel's record where there is one, else the log line
    nearest the end (the exception that ended the job)."""
    if not evidence:
        return None
    telling = [item for item in evidence if item.get("source") != "exit"] or list(evidence)
    item = telling[-1]
    where = item.get("file") or item.get("source") or "log"  # a rank's log or the error file, where named
    if item.get("line") is not None:
        where = f"{where} line {item['line']}"
    return f"{where}: {item.get('text', '')}"


def termination_message(
    *,
    run_id: str,
    state: str,
    exit_code: int,
    attempts: int,
    diagnosis: Mapping[str, Any] | None,
    reason: str | None,
    catalogue: Mapping[str, Cause],
    lang: str = "en",
    max_bytes: int = MAX_BYTES,
) -> str:
    """The run's verdict as one JSON object of at most ``max_bytes`` UTF-8 bytes."""
    cause_id = (diagnosis or {}).get("cause")
    confidence = (diagnosis or {}).get("confidence")
    evidence = deciding_evidence((diagnosis or {}).get("evidence") or [])
    if cause_id is None and state == "stopped" and exit_code == VERDICT_EXIT["tempfail"]:
        # A stop signal that `trainguard stop` did not send: a scheduler's or the kubelet's (DESIGN 5).
        cause_id = "preempted"
        evidence = "a stop signal from outside trainguard (the kubelet, a scheduler or the container runtime)"
    cause = catalogue.get(cause_id) if cause_id else None
    if cause is not None:
        title = cause.title_in(lang)
        fixes = cause.fixes_in(lang)
        fix = fixes[0] if fixes else None
    else:
        title = {"succeeded": ("the run succeeded", "运行成功"), "stopped": ("stopped on request", "已按请求停止")}.get(
            state, (state, state)
        )[1 if lang == "zh" else 0]
        fix = None
    message: dict[str, Any] = {
        "exit_code": exit_code,
        "state": state,
        "cause": cause_id,
        "confidence": confidence,
        "title": title,
        "evidence": evidence,
        "fix": fix,
        "reason": reason,
        "run": run_id,
        "attempts": attempts,
    }
    return _fit(message, max_bytes)


def _size(message: Mapping[str, Any]) -> int:
    return len(json.dumps(message, ensure_ascii=False).encode())


def _fit(message: dict[str, Any], max_bytes: int) -> str:
    """Shorten the long texts (the evidence line first) until the whole object fits: each keeps the
    longest beginning that does (escapes make a character cost up to six bytes in JSON)."""
    for key in _SHRINKABLE:
        text = message.get(key)
        if _size(message) <= max_bytes:
            break
        if not isinstance(text, str):
            continue
        fits, too_long = 0, min(len(text), max_bytes)  # no more characters than bytes can fit
        while too_long - fits > 1:
            middle = (fits + too_long) // 2
            message[key] = text[:middle] + ELLIPSIS
            if _size(message) <= max_bytes:
                fits = middle
            else:
                too_long = middle
        message[key] = text[:fits] + ELLIPSIS if fits else None
    return json.dumps(message, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- adapter
def default_path() -> str | None:
    """``/dev/termination-log`` where it exists and can be written (in a Kubernetes pod), else None."""
    path = DEFAULT_TERMINATION_LOG
    return path if os.path.isfile(path) and os.access(path, os.W_OK) else None


def write_termination_log(path: str, text: str) -> None:
    """Replace the file's content with ``text`` (a bind-mounted file: written in place, not renamed
    over). Raises OSError."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
