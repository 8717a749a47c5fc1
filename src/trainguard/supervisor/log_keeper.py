"""The run's logs kept within their bound, once a tick of the supervisor: the running attempt's log
rotated (``log_rotation``), the ended attempts' logs cut down as they pile up (a restart loop over
weeks), and room given back on a state disk that is nearly full, said once in the attempt's log and
as an event. The journal asks here first for room when the registry finds the disk full."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Protocol

from trainguard._i18n import Text
from trainguard.store import runlogs
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt
from trainguard.supervisor.attempt_files import append_marker
from trainguard.supervisor.containment import Containment
from trainguard.supervisor.log_policy import (
    OLD_HEAD_BYTES,
    OLD_TAIL_BYTES,
    POLL_S,
    EndedLog,
    LogBound,
    plan_old_attempts,
)
from trainguard.supervisor.log_rotation import AttemptLog, disk_of
from trainguard.units import format_size


class WatchedAttempt(Protocol):
    attempt: Attempt
    log_fd: int | None
    containment: Containment


class RunLogs:
    def __init__(self, journal: Journal, run_dir: str) -> None:
        self.journal = journal
        self.run_dir = run_dir
        self.bound = LogBound.from_options(journal.run.options)
        self.state_dir = str(journal.registry.state_dir)
        self.current: AttemptLog | None = None
        self._pressure_said: int | None = None  # the attempt whose log said the disk is nearly full
        journal.room_makers.append(self.make_room)

    def tick(self, watch: WatchedAttempt) -> None:
        attempt = watch.attempt
        if attempt.log_path is None:
            return  # a run of an older trainguard: all its attempts in one output.log
        if self.current is None or self.current.n != attempt.n:
            if self.current is not None:
                self.current.close()
            self.current = None
            with contextlib.suppress(OSError):
                groups = watch.containment.groups
                pause = groups.paused if groups is not None else lambda: contextlib.nullcontext(False)
                self.current = AttemptLog(attempt.n, attempt.log_path, watch.log_fd, self.bound, self.state_dir,
                                          pause=pause)  # fmt: skip
            self._bound_ended_attempts(may_remove=True)
        if self.current is None:
            return
        try:
            rotation = self.current.tick()
        except OSError:
            return  # the next tick tries again: the job goes on either way
        if rotation is not None and rotation.pressure:
            self._bound_ended_attempts(may_remove=False)
            self._say_pressure(attempt)

    def poll_in(self) -> float:
        """Seconds until the running attempt's log should be looked at again."""
        return self.current.poll_in() if self.current is not None else POLL_S

    def last_written(self, n: int) -> float | None:
        """When attempt ``n``'s job last wrote to its log, where its log is bounded (the file's own
        mtime also moves with each rotation and room kept for its tail)."""
        if self.current is None or self.current.n != n:
            return None
        try:
            return self.current.last_written()
        except OSError:
            return None

    def attempt_ended(self, attempt: Attempt) -> None:
        """Cut the ended attempt's log to its bound once more: what the job wrote since the last look
        (a fast writer's last second, a long line with no newline) is not left whole."""
        if self.current is None or self.current.n != attempt.n:
            return
        with contextlib.suppress(OSError):
            self.current.tick()
        self.current.close()
        self.current = None

    def make_room(self) -> int:
        """Bytes given back on the full state disk (the journal's room maker)."""
        before = _free(self.state_dir)
        with contextlib.suppress(OSError):
            if self.current is not None:
                self.current.make_room()
            self._bound_ended_attempts(may_remove=False, budget=0)
        return max(0, _free(self.state_dir) - before)

    def _say_pressure(self, attempt: Attempt) -> None:
        if self._pressure_said == attempt.n:
            return
        self._pressure_said = attempt.n
        disk = disk_of(self.state_dir)
        free, total = format_size(disk.free), format_size(disk.total)
        text = Text(
            f"the state disk is nearly full ({free} free of {total}): attempt {attempt.n}'s log is cut early and keeps "
            f"less (its first part and its newest), so that the run's records have room",
            f"状态目录所在磁盘快满了（共 {total}，剩余 {free}）：第 {attempt.n} 次尝试的日志提前轮转并少保留一些"
            f"（保留开头和最新部分），为运行记录留出空间",
        )
        self.journal.event("log_disk_pressure", {"attempt": attempt.n, "free": disk.free, "total": disk.total,
                                                 "message": text.en, "message_zh": text.zh})  # fmt: skip
        append_marker(attempt.log_path, text)

    # ------------------------------------------------------------------ the ended attempts
    def _bound_ended_attempts(self, *, may_remove: bool, budget: int | None = None) -> None:
        current = self.current.n if self.current is not None else None
        removed = runlogs.logs_removed_through(self.run_dir)
        ended = [a for a in self.journal.run.attempts
                 if a.log_path and a.n != current and a.n > removed and a.ended_at is not None]  # fmt: skip
        logs = {a.n: a.log_path for a in ended}
        sizes = [_ended_log(a.n, a.log_path) for a in sorted(ended, key=lambda a: a.n)]
        plan = plan_old_attempts(sizes, self.bound.old_attempts_bytes if budget is None else budget,
                                 may_remove=may_remove)  # fmt: skip
        for n, action in plan:
            with contextlib.suppress(OSError):
                if action == "trim":
                    trim(logs[n])
                else:
                    remove_log(logs[n])
                    removed = max(removed, n)
        if removed > runlogs.logs_removed_through(self.run_dir):
            with contextlib.suppress(OSError), open(runlogs.removed_logs_path(self.run_dir), "w") as out:
                json.dump({"through": removed}, out)


def _free(path: str) -> int:
    try:
        return disk_of(path).free
    except OSError:
        return 0


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _ended_log(n: int, log_path: str) -> EndedLog:
    kept = runlogs.read_kept(log_path)
    backups = sum(_size(runlogs.backup_path(log_path, k)) for k in range(1, len(kept.backups) + 1))
    return EndedLog(n, _size(runlogs.head_path(log_path)), backups, _size(log_path), trimmed=kept.trimmed)


def trim(log_path: str) -> None:
    """An ended attempt's log cut down to its first lines (the head file) and its last ones (the live
    file); its backups go. Nothing writes to it any more: files are replaced whole."""
    pieces = [piece for piece in runlogs.attempt_pieces(log_path) if piece.path is not None]
    head = _read(pieces[0].path, 0, OLD_HEAD_BYTES) if pieces and pieces[0].start == 0 else b""
    cut = head.rfind(b"\n") + 1
    head = head[:cut] if cut else head
    tail_start, tail = _last_bytes(pieces, OLD_TAIL_BYTES, not_before=len(head))
    kept = runlogs.read_kept(log_path)
    runlogs.write_whole(runlogs.head_path(log_path), head)
    runlogs.write_whole(log_path, tail)
    for k in range(1, len(kept.backups) + 1):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(runlogs.backup_path(log_path, k))
    runlogs.write_kept(log_path, runlogs.Kept(head_bytes=len(head), live_start=tail_start,
                                              dropped_bytes=tail_start - len(head), rotations=kept.rotations,
                                              trimmed=True))  # fmt: skip


def _last_bytes(pieces: list[runlogs.LogPiece], want: int, *, not_before: int) -> tuple[int, bytes]:
    """The last ``want`` bytes of an attempt's output, without a gap and from ``not_before`` on:
    (their offset in all the attempt wrote, the bytes)."""
    tail, start = b"", None
    for piece in reversed(pieces):
        assert piece.path is not None
        end = piece.start + _size(piece.path)
        if start is not None and end != start:
            break  # what was dropped before it: the tail starts after the gap
        take_from = max(piece.start, end - (want - len(tail)), not_before)
        if take_from < end:
            tail = _read(piece.path, take_from - piece.start, end - take_from) + tail
        start = min(take_from, end)
        if len(tail) >= want or take_from > piece.start:
            break
    return (start if start is not None else not_before), tail


def remove_log(log_path: str) -> None:
    kept = runlogs.read_kept(log_path)
    paths = [runlogs.head_path(log_path), log_path, runlogs.kept_record_path(log_path)]
    for path in paths + [runlogs.backup_path(log_path, k) for k in range(1, len(kept.backups) + 1)]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _read(path: str, start: int, length: int) -> bytes:
    with open(path, "rb") as source:
        source.seek(start)
        return source.read(max(0, length))
