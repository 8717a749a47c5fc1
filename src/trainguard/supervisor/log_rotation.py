"""Keeping a run's logs within their bound on disk, without the job's help: the job writes its own
log (its stdout and stderr are the file, opened O_APPEND), so the file is cut in place under it.

Where the filesystem can (ext4, XFS) the piece taken out is removed with
``fallocate(FALLOC_FL_COLLAPSE_RANGE)``: nothing the job writes meanwhile is lost, its appends go on
at the new end. Elsewhere (tmpfs, overlay, NFS) it is copy-then-truncate, as logrotate's
``copytruncate`` does, with the job paused (its cgroup frozen) for the last copy and the
truncation, a moment of microseconds to milliseconds: nothing is lost. Without a freezer (not
root, no delegated cgroup) what the job writes in that moment (a few KiB at 20 MB/s, nothing at a
line a second) is lost, and no line says so. Which pieces are kept is ``log_policy``'s; where they
lie is recorded next to the log
(``store.runlogs``), so `trainguard logs` stitches them.

The log also keeps a little room allocated beyond its end (``FALLOC_FL_KEEP_SIZE``): on a full disk
the job's last lines, the ``No space left on device`` that says why it died, still reach its log.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import time
from collections import deque
from collections.abc import Callable

from trainguard.store import runlogs
from trainguard.store.runlogs import Kept
from trainguard.supervisor.log_policy import MIN_POLL_S, Disk, LiveLog, LogBound, Rotation, plan_rotation, poll_in

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_COLLAPSE_RANGE = 0x08
TAIL_ROOM = 64 * 1024  # allocated beyond the log's end: room for the job's last lines on a full disk
GROWTH_TICKS = 5  # the log's growth per tick is the largest of the last few
CHUNK = 1 << 20
CHASE_ROUNDS = 4  # copies while the job writes, before the last one with the job held still

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """Linux fallocate(2) with its mode; 0, or the errno it failed with."""
    if _libc.fallocate(fd, mode, offset, length) == 0:
        return 0
    return ctypes.get_errno()


def disk_of(path: str) -> Disk:
    info = os.statvfs(path)
    return Disk(info.f_blocks * info.f_frsize, info.f_bavail * info.f_frsize)


def copy_range(src: int, dst: int, start: int, end: int) -> int:
    """Bytes ``start``..``end`` of ``src`` appended to ``dst``; how many were copied."""
    done = 0
    while start + done < end:
        data = os.pread(src, min(CHUNK, end - start - done), start + done)
        if not data:
            break
        os.write(dst, data)
        done += len(data)
    return done


def _new_file(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)


class AttemptLog:
    """The running attempt's log, rotated by its size and by the room left on the state disk."""

    def __init__(self, n: int, log_path: str, read_fd: int | None, bound: LogBound, state_dir: str,
                 pause: Callable[[], contextlib.AbstractContextManager[bool]] = lambda: contextlib.nullcontext(False),
                 ) -> None:  # fmt: skip
        self.n = n
        self.pause = pause  # the job held still for a moment (its cgroup frozen), where it can be
        self.path = log_path
        self.bound = bound
        self.state_dir = state_dir
        # Through the supervisor's own descriptor: the same file even if someone renamed or deleted
        # it, and never created anew.
        self.fd = os.open(f"/proc/self/fd/{read_fd}" if read_fd is not None else log_path, os.O_WRONLY | os.O_CLOEXEC)
        self.read_fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        self.kept = runlogs.read_kept(log_path)
        self.collapse: bool | None = None  # whether the filesystem collapses ranges, once tried
        self.growth: deque[int] = deque(maxlen=GROWTH_TICKS)
        self.last_size: int | None = None
        self.last_look: float | None = None  # monotonic time of the last tick
        # When the job last wrote, wall time. Not the file's mtime alone: each tick's room for the
        # tail (fallocate) and each rotation touch it too, which made a hung job look active.
        self.written_at: float | None = None
        # Bytes per second between ticks, the largest of the last few: one slow moment (the job
        # blocked while its file was cut) does not let `yes` write a second's worth unseen.
        self.rates: deque[float] = deque(maxlen=GROWTH_TICKS)

    def close(self) -> None:
        for fd in (self.fd, self.read_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def tick(self) -> Rotation | None:
        """Rotate the log where the policy says so; keep room for its last lines. The rotation done."""
        size, now = self._look().st_size, time.monotonic()
        grown = max(0, size - (self.last_size if self.last_size is not None else size))
        self.growth.append(grown)
        if self.last_look is not None and now > self.last_look:
            self.rates.append(grown / (now - self.last_look))
        self.last_look = now
        plan = plan_rotation(self._as_policy_sees_it(size), self.bound, disk_of(self.state_dir))
        if plan is not None:
            self.rotate(plan)
        self.last_size = os.fstat(self.fd).st_size
        fallocate(self.fd, FALLOC_FL_KEEP_SIZE, self.last_size, TAIL_ROOM)
        return plan

    def _look(self) -> os.stat_result:
        """The log's stat, noting when the job wrote: a size changed since the last look is the job's
        doing, and its mtime then is the job's write (ours come after the look)."""
        stat = os.fstat(self.fd)
        if self.last_size is None or stat.st_size != self.last_size:
            self.written_at = stat.st_mtime
        return stat

    def last_written(self) -> float | None:
        """When the job last wrote to its log (wall time), as far as the file tells."""
        self._look()
        return self.written_at

    def poll_in(self) -> float:
        """Seconds until this log should be looked at again, by how fast it grows."""
        if not self.rates:
            return MIN_POLL_S  # its rate is learnt in the first moments, before `yes` can write a gigabyte
        return poll_in(self.last_size or 0, max(self.rates), self.bound)

    def make_room(self) -> int:
        """The state disk is full: keep only what the policy keeps under the most pressure. Bytes freed."""
        before = disk_of(self.state_dir)
        plan = plan_rotation(self._as_policy_sees_it(self._look().st_size), self.bound, Disk(before.total, 0))
        if plan is None:
            return 0
        self.rotate(plan)
        self.last_size = os.fstat(self.fd).st_size
        return max(0, disk_of(self.state_dir).free - before.free)

    def _as_policy_sees_it(self, size: int) -> LiveLog:
        return LiveLog(size, tuple(piece_size for _, piece_size in self.kept.backups),
                       head_saved=self.kept.head_bytes > 0 or self.kept.live_start > 0,
                       growth=max(self.growth, default=0))  # fmt: skip

    # ------------------------------------------------------------------ one rotation
    def rotate(self, plan: Rotation) -> None:
        kept = self.kept
        head_bytes, first = kept.head_bytes, 0  # first: bytes at the live file's start that are the head
        if plan.save_head and kept.live_start == 0:
            head_bytes = first = self._save_head(plan.save_head)
        dropped = sum(size for _, size in kept.backups[plan.keep_backups :])
        for k in range(len(kept.backups), plan.keep_backups, -1):
            _remove(runlogs.backup_path(self.path, k))
        older = kept.backups[: plan.keep_backups]
        for k in range(len(older), 0, -1):
            with contextlib.suppress(OSError):
                os.replace(runlogs.backup_path(self.path, k), runlogs.backup_path(self.path, k + 1))
        backup_from, end, copied = self._cut(first, plan.to_backup)
        dropped += end - first - copied
        if older and (backup_from > first or not copied):  # not next to the live file's rest any more
            dropped += sum(size for _, size in older)
            for k in range(2, len(older) + 2):
                _remove(runlogs.backup_path(self.path, k))
            older = ()
        newest = ((kept.live_start + backup_from, copied),) if copied else ()
        self.kept = Kept(head_bytes=head_bytes, live_start=kept.live_start + end, backups=newest + older,
                         dropped_bytes=kept.dropped_bytes + dropped, rotations=kept.rotations + 1)  # fmt: skip
        with contextlib.suppress(OSError):
            runlogs.write_kept(self.path, self.kept)

    def _save_head(self, length: int) -> int:
        """The live file's first ``length`` bytes, to the last whole line, in the head file; how many
        (0 when it cannot be written: then the head goes with the rest)."""
        data = os.pread(self.read_fd, length, 0)
        cut = data.rfind(b"\n") + 1
        data = data[:cut] if cut else data
        try:
            runlogs.write_whole(runlogs.head_path(self.path), data)
        except OSError:
            return 0
        return len(data)

    def _cut(self, first: int, to_backup: int | None) -> tuple[int, int, int]:
        """Take the live file's start out, the newest ``to_backup`` bytes of it (None: all but the
        head) into backup 1: (where the backup starts, where the cut ends, bytes copied), as offsets
        in the live file before the cut."""
        size = os.fstat(self.fd).st_size
        # The plan saw the file a moment ago; a fast writer may have doubled it since: a backup
        # holds at most twice the size (all of it), else only its newest size.
        if to_backup is None and size - first > 2 * self.bound.max_size:
            to_backup = self.bound.max_size
        limit = 2 * self.bound.max_size if to_backup is None else to_backup
        if self.collapse is not False:
            block = max(4096, os.fstat(self.fd).st_blksize)
            end = ((size - 1) // block) * block  # a collapse that reaches the end of the file is refused
            if end > first:
                backup_from = first if to_backup is None else max(first, end - to_backup)
                copied = self._backup(backup_from, end)
                failed = fallocate(self.fd, FALLOC_FL_COLLAPSE_RANGE, 0, end)
                if failed == 0:
                    self.collapse = True
                    return backup_from, end, copied
                if failed not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise OSError(failed, os.strerror(failed))
                self.collapse = False
                _remove(runlogs.backup_path(self.path, 1))
        backup_from = first if to_backup is None else max(first, size - to_backup)
        return self._copy_then_truncate(first, backup_from, limit)

    def _copy_then_truncate(self, first: int, backup_from: int, limit: int) -> tuple[int, int, int]:
        """Copy the live file from ``backup_from`` into backup 1 while the job runs, then, with the job
        paused for the moment (its cgroup frozen), what it wrote meanwhile, and empty the file: nothing
        is lost between the copy's last look and the cut. Without a freezer, what the job writes in
        that moment (microseconds) is lost, as with logrotate's copytruncate. The backup holds at
        most ``limit`` bytes, the newest: a writer faster than the copy is not chased for ever."""
        path = runlogs.backup_path(self.path, 1)
        temporary = f"{path}.tmp"
        out: int | None = None
        copied = 0

        def newest_only(now: int) -> bool:
            """Start again at the newest ``limit`` bytes where the file outgrew them; whether it did."""
            nonlocal backup_from, copied
            if out is None or now - backup_from <= limit:
                return False
            backup_from, copied = now - limit, 0
            os.ftruncate(out, 0)
            os.lseek(out, 0, os.SEEK_SET)
            return True

        with contextlib.suppress(OSError):
            out = _new_file(temporary) if limit else None
            for _ in range(CHASE_ROUNDS):
                now = os.fstat(self.fd).st_size
                if out is None or now <= backup_from + copied + CHUNK:
                    break
                chasing = copied > 0
                if newest_only(now) and chasing:
                    break  # it writes faster than the copy: the rest is copied with the job held still
                copied += copy_range(self.read_fd, out, backup_from + copied, now)
        try:
            with self.pause():
                end = os.fstat(self.fd).st_size
                if out is not None:
                    try:
                        newest_only(end)
                        copied += copy_range(self.read_fd, out, backup_from + copied, end)
                    except OSError:  # no room for the backup: its part is dropped
                        os.close(out)
                        out, copied = None, 0
                        _remove(temporary)
                os.ftruncate(self.fd, 0)
        finally:
            if out is not None:
                os.close(out)
        if out is not None and copied:
            try:
                os.replace(temporary, path)
            except OSError:
                copied = 0
        _remove(temporary)
        return backup_from, max(end, first), copied

    def _backup(self, start: int, end: int) -> int:
        """Bytes ``start``..``end`` of the live file into backup 1. Bytes copied; 0 when there is no
        room for them (they are dropped)."""
        if end <= start:
            return 0
        path = runlogs.backup_path(self.path, 1)
        temporary = f"{path}.tmp"
        try:
            out = _new_file(temporary)
            try:
                copied = copy_range(self.read_fd, out, start, end)
            finally:
                os.close(out)
            os.replace(temporary, path)
        except OSError:
            _remove(temporary)
            return 0
        return copied


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
