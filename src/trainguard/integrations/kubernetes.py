"""Kubernetes: the verdict of a ``trainguard run --foreground`` in a pod's termination message.

The kubelet reads the file at ``terminationMessagePath`` (``/dev/termination-log`` by default) when
the container ends and shows it as ``status.containerStatuses[].state.terminated.message`` (and in
``kubectl describe pod``), cut at 4096 bytes. trainguard writes one JSON object there, made to fit:
exit code, state, cause, confidence, title, the deciding evidence line and the first fix.
``termination_message`` is pure; ``write_termination_log`` is the adapter, which writes a regular
file only and never waits (a FIFO with no reader at the path cannot hold the run's end).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard._i18n import Text
from trainguard.causes import VERDICT_EXIT, Cause

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_BYTES = 4096  # the kubelet keeps no more of a container's termination message
ELLIPSIS = "…"
_SHRINKABLE = ("evidence", "fix", "title", "reason")  # the texts cut, the longest first, when the message is too long


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
    """Shorten the long texts, the longest first, until the whole object fits: every text longer
    than one cap is cut to the cap's length of its beginning (marked with an ellipsis), the shorter
    ones stay whole, and the cap is the largest that fits. So a long reason or fix never costs the
    evidence line its beginning, and the short fields (cause, confidence, the title) stay whole.
    The cap counts characters, the limit bytes: an escape costs up to six bytes in JSON."""
    texts = {key: message[key] for key in _SHRINKABLE if isinstance(message.get(key), str)}
    if _size(message) <= max_bytes or not texts:
        return json.dumps(message, ensure_ascii=False)
    fits, too_long = 0, min(max(len(text) for text in texts.values()), max_bytes)
    while too_long - fits > 1:
        middle = (fits + too_long) // 2
        if _size({**message, **_capped(texts, middle)}) <= max_bytes:
            fits = middle
        else:
            too_long = middle
    return json.dumps({**message, **_capped(texts, fits)}, ensure_ascii=False)


def _capped(texts: Mapping[str, str], cap: int) -> dict[str, str | None]:
    """Each text cut to its first ``cap`` characters and an ellipsis where it is longer (to nothing
    where ``cap`` is 0)."""
    return {key: text if len(text) <= cap else (text[:cap] + ELLIPSIS if cap else None) for key, text in texts.items()}


# ---------------------------------------------------------------------------------------------- adapter
class NotARegularFile(OSError):
    """The termination log's path names something that is not a regular file: it is left alone."""

    def __init__(self, kind: Text) -> None:
        self.why = Text(f"it is {kind.en}, not a regular file", f"它是{kind.zh}，不是普通文件")
        super().__init__(errno.EINVAL, self.why.en)


_KINDS = (
    (stat.S_ISFIFO, Text("a FIFO", "命名管道（FIFO）")),
    (stat.S_ISLNK, Text("a symbolic link", "符号链接")),
    (stat.S_ISDIR, Text("a folder", "目录")),
    (stat.S_ISCHR, Text("a device", "设备文件")),
    (stat.S_ISBLK, Text("a device", "设备文件")),
    (stat.S_ISSOCK, Text("a socket", "套接字")),
)
_OTHER_KIND = Text("something else", "其他类型的文件")


def _refuse_unless_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotARegularFile(next((kind for is_kind, kind in _KINDS if is_kind(mode)), _OTHER_KIND))


def default_path() -> str | None:
    """``/dev/termination-log`` where it is a regular file that can be written (in a Kubernetes pod),
    else None."""
    path = DEFAULT_TERMINATION_LOG
    try:
        regular = stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return None
    return path if regular and os.access(path, os.W_OK) else None


def write_termination_log(path: str, text: str) -> None:
    """Replace the content of the regular file at ``path``, or create it, with ``text`` (the kubelet
    bind-mounts a regular file there: it is written in place, not renamed over). Anything else at
    ``path`` is refused with NotARegularFile before it is opened, and nothing here waits: a FIFO's
    open would wait for a reader for good, a device's open can act (a terminal, a tape), and a
    symbolic link would turn the truncation on whatever file it names (a kubelet's path never is
    one: the path to pass is the file's own). Raises OSError."""
    with contextlib.suppress(FileNotFoundError):
        _refuse_unless_regular(os.lstat(path).st_mode)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o644), "w", encoding="utf-8") as out:
        _refuse_unless_regular(os.fstat(out.fileno()).st_mode)  # swapped since it was looked at
        out.truncate(0)
        out.write(text)
