"""The registry's SQLite database: opened in WAL mode with one connection per process, written in
transactions that take the write lock at once, safe with several supervisors writing and any number
of readers.

The state folder is 0700 and every file in it 0600 (a webhook token sits in a run's options): an
existing folder or database is tightened when it is opened. Every SQLite or OS error surfaces as a
:class:`RegistryError` with one line a person can act on.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from trainguard.errors import UsageError
from trainguard.paths import check_trusted
from trainguard.store.schema import apply_schema, schema_is_current
from trainguard.store.space_reserve import SpaceReserve

T = TypeVar("T")


class RegistryError(UsageError):
    """The registry cannot be read or written (disk full, read-only, permissions, corrupt).
    ``disk_full``: for want of room on the state disk."""

    disk_full = False


def is_disk_full(exc: BaseException) -> bool:
    """SQLite's "database or disk is full" (SQLITE_FULL), or ENOSPC / EDQUOT from the OS."""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def registry_errors(method: Callable[..., T]) -> Callable[..., T]:
    """SQLite and OS errors leave a public method as one RegistryError naming the database."""

    @functools.wraps(method)
    def wrapper(self: Database, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            error = RegistryError(
                f"the run registry {self.db_path} cannot be used: {_describe(exc)}",
                f"无法使用运行记录库 {self.db_path}：{_describe(exc)}",
            )
            error.disk_full = is_disk_full(exc)
            raise error from exc

    return wrapper


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


def _use_wal(db: sqlite3.Connection, patience_s: float = 30.0) -> None:
    """Switch the database to WAL, which takes a write lock inside the pragma's own read: SQLite
    then answers "database is locked" at once, without the busy timeout, while another process
    writes (two commands opening a new registry together), so it is tried again here."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) 0700, or tighten it to 0700 when it exists and is ours."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077 and path.stat().st_uid == os.geteuid():
        path.chmod(0o700)


def _private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if missing; tighten an existing one of ours to 0600.

    An existing database is never opened here: closing any descriptor of it drops every POSIX lock
    this process holds on it, those of its open SQLite connections too, and the next command to
    close the database would take itself for its last user and delete the WAL they write into."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        return
    except FileExistsError:
        pass
    info = path.stat()
    if info.st_mode & 0o077 and info.st_uid == os.geteuid():
        path.chmod(0o600)


class Database:
    """The database under ``state_dir``, created or brought up to date when it is opened; the
    registry's records are read and written through it."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.db_path = state_dir / "runs.sqlite"
        self._db: sqlite3.Connection | None = None
        self._db_pid = 0
        self._db_inode: int | None = None
        try:
            self._open()
        except (OSError, sqlite3.Error) as exc:
            raise RegistryError(
                f"cannot use the state folder {state_dir}: {_describe(exc)} (set TRAINGUARD_HOME to a writable folder)",
                f"无法使用状态目录 {state_dir}：{_describe(exc)}（请把 TRAINGUARD_HOME 设为可写目录）",
            ) from exc

    def _open(self) -> None:
        check_trusted(self.state_dir)
        private_dir(self.state_dir)
        for suffix in ("", "-wal", "-shm"):  # the database and its companions: the user's own, or nothing
            check_trusted(self.db_path.with_name(self.db_path.name + suffix), within=self.state_dir)
        _private_file(self.db_path)
        # SQLite gives the WAL and shared-memory files the database's mode; older ones are tightened.
        for suffix in ("-wal", "-shm"):
            extra = self.db_path.with_name(self.db_path.name + suffix)
            with contextlib.suppress(FileNotFoundError):
                if extra.stat().st_mode & 0o077 and extra.stat().st_uid == os.geteuid():
                    extra.chmod(0o600)
        with self._connect() as db:
            if schema_is_current(db):  # read only: a read-only registry can still be read
                return
        # Made, or brought up to date, in one write transaction taken at once: a statement that reads
        # and then writes (CREATE TABLE IF NOT EXISTS) upgrades its read lock, and SQLite refuses that
        # upgrade at once, without waiting, while another process writes: two commands opening a new
        # registry together failed with "database is locked".
        with self._transaction() as db:
            apply_schema(db)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One connection per process, kept open: a supervisor writes a handful of events between a
        job's death and its restart, and opening the database for each cost ~2 ms."""
        if self._db is None or self._db_pid != os.getpid():
            db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA busy_timeout=30000")
            _use_wal(db)
            # In WAL mode NORMAL never corrupts the database; a power cut may lose the last few
            # events, and each state change stops costing an fsync.
            db.execute("PRAGMA synchronous=NORMAL")
            self._db, self._db_pid = db, os.getpid()
            with contextlib.suppress(OSError):
                self._db_inode = self.db_path.stat().st_ino
        yield self._db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # a failed COMMIT (disk full) has already rolled back
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise

    def replaced(self) -> bool:
        """True when the database file this process writes to was deleted or replaced (the state
        folder removed under a running supervisor)."""
        try:
            return self._db_inode is not None and self.db_path.stat().st_ino != self._db_inode
        except OSError:
            return True

    def in_reserve(self, write: Callable[[], T]) -> T:
        """``write``, tried once more in the state disk's reserve when the disk is full: for the
        records that say how a run ends (``space_reserve``)."""
        try:
            return write()
        except RegistryError as exc:
            if not exc.disk_full or not SpaceReserve(self.state_dir).spend():
                raise
        return write()

    @registry_errors
    def reopen(self) -> None:
        """Start over on the database at the same path (recreated when it is gone)."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        self._db = None
        self._open()
