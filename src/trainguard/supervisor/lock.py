"""Exactly one supervisor per run: it holds an exclusive flock on ``supervisor.lock`` in the run's
folder for its whole life, taken before it touches the job. The kernel drops the lock the instant the
holder dies (a zombie holds nothing), so "is the run watched?" is "is the lock held?", never a guess
from a pid. The holder writes its pid and start time into the file for the messages that name it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from trainguard._proc import ProcessRef, start_time
from trainguard.errors import UsageError

LOCK_NAME = "supervisor.lock"
# Probes (`status`, `ps`) hold the lock shared for a few microseconds; a supervisor that meets one
# tries again for this long before it concludes that another supervisor holds it.
ACQUIRE_PATIENCE_S = 1.0


class AlreadyWatched(UsageError):
    def __init__(self, run_id: str, holder: ProcessRef | None) -> None:
        who = f"supervisor {holder.pid}" if holder else "another supervisor"
        super().__init__(f"run {run_id} is already watched by {who}", f"运行 {run_id} 已由监督进程 {who} 管理")
        self.holder = holder


def _read_holder(fd: int) -> ProcessRef | None:
    with contextlib.suppress(OSError, ValueError):
        pid, _, start = os.pread(fd, 64, 0).decode().strip().partition(" ")
        if pid:
            return ProcessRef(int(pid), int(start) if start else None)
    return None


class SupervisorLock:
    """Held by the process that supervises (or, briefly, stops) a run, and by the command that creates
    a run from before its record is visible until its supervisor holds the same lock (handed over
    with the descriptor: a flock belongs to the open file, not to a process)."""

    def __init__(self, fd: int, path: Path, taken_at: float | None = None) -> None:
        self._fd = fd
        self.path = path
        self.taken_at = time.time() if taken_at is None else taken_at  # requests older than this were for others

    @property
    def fd(self) -> int:
        return self._fd

    @classmethod
    def inherit(cls, fd: int, run_dir: str | os.PathLike[str], taken_at: float) -> SupervisorLock:
        """The lock the creating command took and handed to this process (``fd``, held since
        ``taken_at``): this process is its holder now."""
        os.set_inheritable(fd, False)  # the job and anything else this process starts must not hold it
        lock = cls(fd, Path(run_dir) / LOCK_NAME, taken_at)
        lock._write_holder()
        return lock

    def _write_holder(self) -> None:
        pid = os.getpid()
        holder = f"{pid} {start_time(pid) or ''}\n".encode()
        os.pwrite(self._fd, holder, 0)  # then cut what a longer one left: never read empty
        os.ftruncate(self._fd, len(holder))

    @classmethod
    def acquire(
        cls, run_dir: str | os.PathLike[str], run_id: str, patience_s: float = ACQUIRE_PATIENCE_S
    ) -> SupervisorLock:
        path = Path(run_dir) / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + patience_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise AlreadyWatched(run_id, holder) from None
                time.sleep(0.02)
        lock = cls(fd, path)
        lock._write_holder()
        return lock

    def still_ours(self) -> bool:
        """False once the lock file was deleted or replaced under us (the state folder removed)."""
        try:
            return os.fstat(self._fd).st_ino == os.stat(self.path).st_ino
        except OSError:
            return False

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def holder(run_dir: str | os.PathLike[str]) -> ProcessRef | None:
    """The supervisor that holds the run's lock, or None when nobody does (it died, or never ran)."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or ProcessRef(0)
        return None  # we got it: nobody holds it exclusively (closing the fd lets it go)
    finally:
        os.close(fd)
