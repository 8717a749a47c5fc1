"""Where a run's output is on disk: one fresh file per attempt (``attempt-N.log``), ``output.log`` a
symlink to the current one, and what is kept of an attempt's log once it is bounded (its head, its
backups, what was dropped between). Runs recorded by an older trainguard kept every attempt in one
``output.log`` at recorded offsets; both are read here, so `logs`, `diagnose` and `report` never
need to know which."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from datetime import datetime

from trainguard import _untrusted as untrusted
from trainguard.store.registry import Attempt, Run
from trainguard.units import format_size


@dataclass(frozen=True)
class LogRegion:
    path: str
    start: int = 0
    end: int | None = None  # None: to the end of the file

    def exists(self) -> bool:
        return os.path.exists(self.path)


def attempt_region(run: Run, attempt: Attempt) -> LogRegion:
    if attempt.log_path:
        return LogRegion(attempt.log_path)
    following = [a for a in run.attempts if a.n > attempt.n and not a.log_path]
    return LogRegion(run.log_path, attempt.log_offset, following[0].log_offset if following else None)


def start_marker(attempt: Attempt, previous: Attempt | None, lang: str = "en") -> str:
    """The line `trainguard logs` shows before an attempt's output (it is not in the attempt's file:
    the job writes to a fresh, empty file)."""
    stamp = datetime.fromtimestamp(attempt.started_at).strftime("%Y-%m-%d %H:%M:%S")
    if lang == "zh":
        text = f"第 {attempt.n} 次尝试"
        if previous is not None and previous.cause:
            text += f" · 上一次终止原因：{previous.cause}"
        text += f" · 从 {attempt.resumed_from} 恢复" if attempt.resumed_from else " · 从头开始"
        if attempt.skipped:
            text += " · 跳过不完整的检查点 " + " | ".join(attempt.skipped)
    else:
        text = f"attempt {attempt.n}"
        if previous is not None and previous.cause:
            text += f" · previous attempt died: {previous.cause}"
        text += f" · resuming from {attempt.resumed_from}" if attempt.resumed_from else " · starting fresh"
        if attempt.skipped:  # incomplete ones are reported, never chosen, never deleted
            text += " · skipped incomplete " + " | ".join(attempt.skipped)
    return f"==== trainguard {stamp} · {text} ====\n"


# ---------------------------------------------------------------- what is kept of a bounded log
# An attempt's log is bounded (``supervisor.log_rotation``): once it has grown past its size, its
# first part is kept in ``attempt-N.head.log``, earlier pieces of its newest part in
# ``attempt-N.log.1`` (the newest), ``.2``, ..., and ``attempt-N.kept.json`` says where each piece
# lies in everything the attempt wrote (its offset there) and how much was dropped in between.


def head_path(log_path: str) -> str:
    return log_path.removesuffix(".log") + ".head.log"


def backup_path(log_path: str, k: int) -> str:
    return f"{log_path}.{k}"


def kept_record_path(log_path: str) -> str:
    return log_path.removesuffix(".log") + ".kept.json"


def removed_logs_path(run_dir: str) -> str:
    """Where a run notes that the logs of its oldest attempts were removed to bound its logs."""
    return os.path.join(run_dir, "removed-logs.json")


@dataclass(frozen=True)
class Kept:
    """Where the pieces of one attempt's output lie in all it wrote: the head (from 0), the backups
    (``(offset, size)``, backup 1 first) and the live file (from ``live_start``)."""

    head_bytes: int = 0
    live_start: int = 0
    backups: tuple[tuple[int, int], ...] = ()
    dropped_bytes: int = 0
    rotations: int = 0
    trimmed: bool = False  # an ended attempt cut down to its first and last lines

    def to_json(self) -> dict:
        return {"head_bytes": self.head_bytes, "live_start": self.live_start,
                "backups": [list(piece) for piece in self.backups], "dropped_bytes": self.dropped_bytes,
                "rotations": self.rotations, "trimmed": self.trimmed}  # fmt: skip


def read_kept(log_path: str) -> Kept:
    """What the supervisor recorded of the log's pieces; a log never rotated is all in its file."""
    record = untrusted.load_object(kept_record_path(log_path))
    if record is None:
        return Kept()
    numbers = [record.get(key) for key in ("head_bytes", "live_start", "dropped_bytes", "rotations")]
    backups = record.get("backups")
    pairs = backups if isinstance(backups, list) else []

    def count(value: object) -> bool:
        return untrusted.is_int(value) and value >= 0

    pieces_ok = all(isinstance(pair, list) and len(pair) == 2 and all(map(count, pair)) for pair in pairs)
    if not all(map(count, numbers)) or not pieces_ok:
        untrusted.warn_once(kept_record_path(log_path), "not a record of the log's pieces")
        return Kept()
    head, live_start, dropped, rotations = numbers
    return Kept(head, live_start, tuple((a, b) for a, b in pairs), dropped, rotations, record.get("trimmed") is True)


def write_kept(log_path: str, kept: Kept) -> None:
    write_whole(kept_record_path(log_path), json.dumps(kept.to_json()).encode())


def write_whole(path: str, data: bytes) -> None:
    """``data`` as the whole of ``path`` (0600), written under a temporary name then renamed: a reader
    never sees half of it, and a failed write leaves the old file and no temporary one."""
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@dataclass(frozen=True)
class LogPiece:
    """A piece of an attempt's output: ``path`` holds its bytes from ``start`` on (its offset in all the
    attempt wrote); ``path`` None: ``size`` bytes dropped there. The live file's size is None (it grows)."""

    path: str | None
    start: int
    size: int | None


def attempt_pieces(log_path: str) -> list[LogPiece]:
    """The pieces of an attempt's output in order: its head, what was dropped, its backups (the
    oldest first) and its live file. A log never rotated is one piece: its file."""
    kept = read_kept(log_path)
    if kept.rotations == 0 and not kept.trimmed:
        return [LogPiece(log_path, 0, None)]
    found = [LogPiece(head_path(log_path), 0, kept.head_bytes)] if kept.head_bytes else []
    found += [LogPiece(backup_path(log_path, k), start, size)
              for k, (start, size) in reversed(list(enumerate(kept.backups, 1)))]  # fmt: skip
    found.append(LogPiece(log_path, kept.live_start, None))
    pieces: list[LogPiece] = []
    reached = 0
    for piece in found:
        if piece.start > reached:
            pieces.append(LogPiece(None, reached, piece.start - reached))
        pieces.append(piece)
        reached = max(reached, piece.start + (piece.size or 0))
    return pieces


def logs_removed_through(run_dir: str) -> int:
    """The newest attempt whose log was removed to bound the run's logs (0: none)."""
    record = untrusted.load_object(removed_logs_path(run_dir))
    through = record.get("through") if record else None
    return through if untrusted.is_int(through) and through > 0 else 0


def dropped_marker(attempt_n: int, size: int, lang: str = "en") -> str:
    """The line `trainguard logs` shows where a bounded log dropped part of an attempt's output."""
    amount = format_size(size)
    if lang == "zh":
        text = (f"第 {attempt_n} 次尝试的输出在此处省略了 {amount}"
                "（日志有上限：保留开头和最新部分，见 --log-max-size、--log-backups）")  # fmt: skip
    else:
        text = (f"{amount} of attempt {attempt_n}'s output dropped here (its log is bounded: it keeps the first "
                "part and the newest; see --log-max-size, --log-backups)")  # fmt: skip
    return f"==== trainguard · {text} ====\n"


def kept_files(log_path: str, live_path: str | None = None) -> list[str]:
    """The files that hold what is kept of an attempt's output, in order (its head, its backups,
    the live file, read through ``live_path`` when given): what a diagnosis reads. A log never
    rotated is its own file."""
    files = [piece.path for piece in attempt_pieces(log_path) if piece.path is not None]
    return [live_path if live_path is not None and path == log_path else path for path in files]
