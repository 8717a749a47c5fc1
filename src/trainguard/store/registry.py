"""The run registry: runs, their attempts and every state change, in SQLite (WAL) under the state
dir, safe with several supervisors writing and any number of readers.

The state folder is 0700 and every file in it 0600 (a webhook token sits in a run's options): an
existing folder or database is tightened when it is opened. Every SQLite or OS error surfaces as a
:class:`RegistryError` with one line a person can act on.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainguard._i18n import Text
from trainguard.errors import UsageError

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    name TEXT,
    host TEXT NOT NULL,
    command TEXT NOT NULL,          -- JSON list
    cwd TEXT NOT NULL,
    created_at REAL NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    supervisor_pid INTEGER,
    job_pid INTEGER,
    boot_id TEXT,
    run_dir TEXT NOT NULL,
    log_path TEXT NOT NULL,
    options TEXT NOT NULL           -- JSON object
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id TEXT NOT NULL REFERENCES runs(id),
    n INTEGER NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    pid INTEGER,
    exit_code INTEGER,
    signal INTEGER,
    cause TEXT,
    confidence REAL,
    resumed_from TEXT,
    log_offset INTEGER NOT NULL DEFAULT 0,
    diagnosis TEXT,                 -- JSON, as `trainguard diagnose --json` prints it
    PRIMARY KEY (run_id, n)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_run ON events(run_id, id);
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    time REAL NOT NULL,
    data TEXT NOT NULL              -- JSON, monitor.sampler.Sample.to_dict()
);
CREATE INDEX IF NOT EXISTS samples_by_run ON samples(run_id, time);
"""

# Columns added after the first release: added to an older registry when it is opened.
MIGRATIONS = {
    "runs": {
        "supervisor_start": "INTEGER",  # the supervisor's start time (ticks since boot): pid + start = identity
        "job_start": "INTEGER",
        "containment": "TEXT",  # how the current attempt is contained: "cgroup v1 (...)", "partial (...)"
        "stop_request": "TEXT",  # JSON {"time", "grace_s"}: `trainguard stop` asked for a stop
        "reason_zh": "TEXT",  # the reason in Chinese (reason is in English)
    },
    "attempts": {
        "pid_start": "INTEGER",
        "log_path": "TEXT",  # the attempt's own log file (NULL: an older run, one file with offsets)
        "containment": "TEXT",  # JSON: its cgroups, so an adopting supervisor or `stop` can empty them
        "progress": "TEXT",  # JSON: what the job reported (trainguard.progress)
        "skipped": "TEXT",  # JSON: incomplete checkpoints newer than the one resumed from, "path: why"
    },
}

# Samples thin out with age: every one for the last 15 minutes (the minutes before a death matter
# most), one a minute for a day, one every ten minutes after that.
DOWNSAMPLING = ((15 * 60, 60), (24 * 3600, 600))


@dataclass
class Attempt:
    n: int
    started_at: float
    ended_at: float | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    cause: str | None = None
    confidence: float | None = None
    resumed_from: str | None = None
    log_offset: int = 0
    diagnosis: dict[str, Any] | None = None
    pid_start: int | None = None
    log_path: str | None = None
    containment: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    skipped: list[str] | None = None


@dataclass
class Run:
    id: str
    name: str | None
    host: str
    command: list[str]
    cwd: str
    created_at: float
    state: str
    run_dir: str
    log_path: str
    options: dict[str, Any]
    reason: str | None = None
    supervisor_pid: int | None = None
    job_pid: int | None = None
    boot_id: str | None = None
    supervisor_start: int | None = None
    job_start: int | None = None
    containment: str | None = None
    stop_request: dict[str, Any] | None = None
    reason_zh: str | None = None
    attempts: list[Attempt] = field(default_factory=list)

    def reason_in(self, lang: str) -> str | None:
        return self.reason_zh if lang == "zh" and self.reason_zh else self.reason

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


class RegistryError(UsageError):
    """The registry cannot be read or written (disk full, read-only, permissions, corrupt)."""


class RunNotFound(UsageError):
    pass


class NameInUse(UsageError):
    def __init__(self, name: str, run_id: str) -> None:
        super().__init__(
            f"a run named {name!r} is still active ({run_id}): stop it first, or choose another --name",
            f"名为 {name!r} 的运行仍在进行（{run_id}）：请先停止它，或换一个 --name",
        )
        self.run_id = run_id


def _registry_errors(method: Callable[..., T]) -> Callable[..., T]:
    """SQLite and OS errors leave a public method as one RegistryError naming the database."""

    @functools.wraps(method)
    def wrapper(self: Registry, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            raise RegistryError(
                f"the run registry {self.db_path} cannot be used: {_describe(exc)}",
                f"无法使用运行记录库 {self.db_path}：{_describe(exc)}",
            ) from exc

    return wrapper


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


_SCHEMA_OBJECTS = frozenset(re.findall(r"CREATE (?:TABLE|INDEX) IF NOT EXISTS ([a-z_]+)", SCHEMA))


def _schema_is_current(db: sqlite3.Connection) -> bool:
    """Every table, index and column this version uses exists."""
    if not _SCHEMA_OBJECTS.issubset(row["name"] for row in db.execute("SELECT name FROM sqlite_master")):
        return False
    for table, columns in MIGRATIONS.items():
        if not set(columns) <= {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}:
            return False
    return True


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


def _private_dir(path: Path) -> None:
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


class Registry:
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
        _private_dir(self.state_dir)
        _private_file(self.db_path)
        # SQLite gives the WAL and shared-memory files the database's mode; older ones are tightened.
        for suffix in ("-wal", "-shm"):
            extra = self.db_path.with_name(self.db_path.name + suffix)
            with contextlib.suppress(FileNotFoundError):
                if extra.stat().st_mode & 0o077 and extra.stat().st_uid == os.geteuid():
                    extra.chmod(0o600)
        with self._connect() as db:
            if _schema_is_current(db):  # read only: a read-only registry can still be read
                return
        # Made, or brought up to date, in one write transaction taken at once: a statement that reads
        # and then writes (CREATE TABLE IF NOT EXISTS) upgrades its read lock, and SQLite refuses that
        # upgrade at once, without waiting, while another process writes: two commands opening a new
        # registry together failed with "database is locked".
        with self._transaction() as db:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            for table, columns in MIGRATIONS.items():
                have = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
                for column, kind in columns.items():
                    if column not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

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

    @_registry_errors
    def reopen(self) -> None:
        """Start over on the database at the same path (recreated when it is gone)."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        self._db = None
        self._open()

    # ------------------------------------------------------------------ runs
    @_registry_errors
    def create_run(
        self,
        command: list[str],
        *,
        name: str | None,
        cwd: str,
        options: dict[str, Any],
        before_visible: Callable[[str, Path], None] | None = None,
    ) -> Run:
        """A new run; refused (NameInUse) while another active run has the same name.
        ``before_visible(run_id, run_dir)`` runs once its folder exists and before any other process
        can see the record (the creator takes the run's supervisor lock there)."""
        run_id = None
        run_dir = None
        try:
            with self._transaction() as db:
                if name is not None:
                    live = db.execute(
                        f"SELECT id FROM runs WHERE name = ? AND state IN ({','.join('?' * len(ACTIVE))})",
                        (name, *ACTIVE),
                    ).fetchone()
                    if live is not None:
                        raise NameInUse(name, live["id"])
                while True:
                    run_id = secrets.token_hex(4)
                    if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                        break
                run_dir = self.state_dir / "runs" / run_id
                _private_dir(run_dir.parent)
                run_dir.mkdir(mode=0o700)
                if before_visible is not None:
                    before_visible(run_id, run_dir)
                run = Run(
                    id=run_id,
                    name=name,
                    host=socket.gethostname(),
                    command=command,
                    cwd=cwd,
                    created_at=time.time(),
                    state="starting",
                    run_dir=str(run_dir),
                    log_path=str(run_dir / "output.log"),
                    options=options,
                    boot_id=boot_id(),
                )
                db.execute(
                    "INSERT INTO runs (id, name, host, command, cwd, created_at, state, run_dir, log_path, options,"
                    " boot_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run.id, run.name, run.host, json.dumps(command), cwd, run.created_at, run.state, run.run_dir,
                     run.log_path, json.dumps(options), run.boot_id),
                )  # fmt: skip
                db.execute(
                    "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, 'created', ?)",
                    (run.id, run.created_at, json.dumps({"command": command})),
                )
        except BaseException:
            if run_dir is not None:  # no record, no folder: nothing half-made is left behind
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        return run

    @_registry_errors
    def delete_run(self, run_id: str) -> None:
        """Forget a run that never started (its supervisor could not start): record and folder."""
        run = self.get(run_id)
        with self._transaction() as db:
            for table in ("events", "samples", "attempts"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        if run is not None:
            shutil.rmtree(run.run_dir, ignore_errors=True)

    @_registry_errors
    def update_run(self, run_id: str, **fields: Any) -> None:
        columns = ", ".join(f"{key} = ?" for key in fields)
        values = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in fields.values()]
        with self._connect() as db:
            db.execute(f"UPDATE runs SET {columns} WHERE id = ?", (*values, run_id))

    @_registry_errors
    def request_stop(self, run_id: str, grace_s: float, *, replace_stale: bool = False) -> bool:
        """Record that `trainguard stop` asked this run to stop; False when another stop asked first
        (``replace_stale``: the earlier request has nobody left to act on it)."""
        request = json.dumps({"time": time.time(), "grace_s": grace_s})
        condition = "" if replace_stale else " AND stop_request IS NULL"
        with self._connect() as db:
            updated = db.execute(f"UPDATE runs SET stop_request = ? WHERE id = ?{condition}", (request, run_id))
            return updated.rowcount == 1

    @_registry_errors
    def set_state(
        self, run_id: str, state: str, *, reason: Text | None = None, data: dict[str, Any] | None = None
    ) -> None:
        now = time.time()
        en, zh = reason if reason is not None else (None, None)
        with self._transaction() as db:
            db.execute("UPDATE runs SET state = ?, reason = COALESCE(?, reason), reason_zh = COALESCE(?, reason_zh)"
                       " WHERE id = ?", (state, en, zh, run_id))  # fmt: skip
            if state not in ACTIVE:  # a stop request ends with the run it stopped
                db.execute("UPDATE runs SET stop_request = NULL WHERE id = ?", (run_id,))
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, ?, ?)",
                (run_id, now, f"state:{state}", json.dumps({"reason": en, **(data or {})})),
            )

    @_registry_errors
    def event(self, run_id: str, kind: str, data: dict[str, Any], *, at: float | None = None) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, ?, ?)",
                (run_id, time.time() if at is None else at, kind, json.dumps(data)),
            )

    @_registry_errors
    def events(self, run_id: str, kinds: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """The run's events in the order they were recorded; only those of ``kinds`` when given."""
        query = "SELECT time, kind, data FROM events WHERE run_id = ?"
        if kinds is not None:
            query += f" AND kind IN ({','.join('?' * len(kinds))})"
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY id", (run_id, *(kinds or ()))).fetchall()
        return [{"time": r["time"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    @_registry_errors
    def latest_event(self, run_id: str, kind: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT time, kind, data FROM events WHERE run_id = ? AND kind = ? ORDER BY id DESC LIMIT 1",
                (run_id, kind),
            ).fetchone()
        return {"time": row["time"], "kind": row["kind"], **json.loads(row["data"])} if row else None

    # ------------------------------------------------------------------ attempts
    @_registry_errors
    def start_attempt(self, run_id: str, attempt: Attempt) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO attempts (run_id, n, started_at, pid, pid_start, resumed_from, log_offset,"
                " log_path, containment, skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, attempt.n, attempt.started_at, attempt.pid, attempt.pid_start, attempt.resumed_from,
                 attempt.log_offset, attempt.log_path, _json(attempt.containment), _json(attempt.skipped)),
            )  # fmt: skip
            db.execute("UPDATE runs SET job_pid = ?, job_start = ? WHERE id = ?",
                       (attempt.pid, attempt.pid_start, run_id))  # fmt: skip
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, 'attempt_started', ?)",
                (run_id, attempt.started_at,
                 json.dumps({"n": attempt.n, "pid": attempt.pid, "resumed_from": attempt.resumed_from})),
            )  # fmt: skip

    @_registry_errors
    def end_attempt(self, run_id: str, attempt: Attempt) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE attempts SET ended_at = ?, exit_code = ?, signal = ?, cause = ?, confidence = ?, diagnosis = ?,"
                " progress = ? WHERE run_id = ? AND n = ?",
                (attempt.ended_at, attempt.exit_code, attempt.signal, attempt.cause, attempt.confidence,
                 _json(attempt.diagnosis), _json(attempt.progress), run_id, attempt.n),
            )  # fmt: skip
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, 'attempt_ended', ?)",
                (run_id, attempt.ended_at, json.dumps({"n": attempt.n, "exit_code": attempt.exit_code,
                 "signal": attempt.signal, "cause": attempt.cause, "confidence": attempt.confidence})),
            )  # fmt: skip

    @_registry_errors
    def save_progress(self, run_id: str, n: int, progress: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute("UPDATE attempts SET progress = ? WHERE run_id = ? AND n = ?", (_json(progress), run_id, n))

    @_registry_errors
    def restore_run(self, run: Run) -> None:
        """Write a whole run back (its record and attempts) into a registry that lost it: a supervisor
        keeps its run in memory, and puts it back when the state folder was removed under it."""
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO runs (id, name, host, command, cwd, created_at, state, reason, supervisor_pid,"
                " job_pid, boot_id, run_dir, log_path, options, supervisor_start, job_start, containment, reason_zh)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run.id, run.name, run.host, json.dumps(run.command), run.cwd, run.created_at, run.state, run.reason,
                 run.supervisor_pid, run.job_pid, run.boot_id, run.run_dir, run.log_path, json.dumps(run.options),
                 run.supervisor_start, run.job_start, run.containment, run.reason_zh),
            )  # fmt: skip
            for a in run.attempts:
                db.execute(
                    "INSERT OR REPLACE INTO attempts (run_id, n, started_at, ended_at, pid, pid_start, exit_code,"
                    " signal, cause, confidence, resumed_from, log_offset, log_path, diagnosis, containment, progress,"
                    " skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run.id, a.n, a.started_at, a.ended_at, a.pid, a.pid_start, a.exit_code, a.signal, a.cause,
                     a.confidence, a.resumed_from, a.log_offset, a.log_path, _json(a.diagnosis), _json(a.containment),
                     _json(a.progress), _json(a.skipped)),
                )  # fmt: skip

    # ------------------------------------------------------------------ samples
    @_registry_errors
    def add_sample(self, run_id: str, sample_time: float, data: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO samples (run_id, time, data) VALUES (?, ?, ?)", (run_id, sample_time, json.dumps(data))
            )

    @_registry_errors
    def samples(self, run_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute("SELECT data FROM samples WHERE run_id = ? AND time >= ? ORDER BY time", (run_id, since))
            return [json.loads(row["data"]) for row in rows]

    @_registry_errors
    def latest_sample(self, run_id: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT data FROM samples WHERE run_id = ? ORDER BY time DESC LIMIT 1", (run_id,)
            ).fetchone()
        return json.loads(row["data"]) if row else None

    @_registry_errors
    def downsample(self, run_id: str, now: float) -> None:
        with self._transaction() as db:
            for age, bucket in DOWNSAMPLING:
                db.execute(
                    "DELETE FROM samples WHERE run_id = ? AND time < ? AND id NOT IN ("
                    " SELECT MIN(id) FROM samples WHERE run_id = ? AND time < ? GROUP BY CAST(time / ? AS INTEGER))",
                    (run_id, now - age, run_id, now - age, bucket),
                )

    # ------------------------------------------------------------------ reading
    def _run_from(self, db: sqlite3.Connection, row: sqlite3.Row) -> Run:
        run = Run(
            id=row["id"], name=row["name"], host=row["host"], command=json.loads(row["command"]), cwd=row["cwd"],
            created_at=row["created_at"], state=row["state"], run_dir=row["run_dir"], log_path=row["log_path"],
            options=json.loads(row["options"]), reason=row["reason"], supervisor_pid=row["supervisor_pid"],
            job_pid=row["job_pid"], boot_id=row["boot_id"], supervisor_start=row["supervisor_start"],
            job_start=row["job_start"], containment=row["containment"],
            stop_request=_load(row["stop_request"]), reason_zh=row["reason_zh"],
        )  # fmt: skip
        for a in db.execute("SELECT * FROM attempts WHERE run_id = ? ORDER BY n", (run.id,)):
            run.attempts.append(
                Attempt(
                    n=a["n"],
                    started_at=a["started_at"],
                    ended_at=a["ended_at"],
                    pid=a["pid"],
                    exit_code=a["exit_code"],
                    signal=a["signal"],
                    cause=a["cause"],
                    confidence=a["confidence"],
                    resumed_from=a["resumed_from"],
                    log_offset=a["log_offset"],
                    diagnosis=_load(a["diagnosis"]),
                    pid_start=a["pid_start"],
                    log_path=a["log_path"],
                    containment=_load(a["containment"]),
                    progress=_load(a["progress"]),
                    skipped=_load(a["skipped"]),
                )
            )
        return run

    @_registry_errors
    def get(self, run_id: str) -> Run | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            return self._run_from(db, row) if row else None

    @_registry_errors
    def resolve(self, ref: str) -> Run:
        """A run by its exact id, its exact name (the newest run of that name), or a unique prefix
        of its id. Nothing in ``ref`` is a wildcard."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (ref,)).fetchone()
            if row is None:
                row = db.execute(
                    "SELECT * FROM runs WHERE name = ? ORDER BY created_at DESC LIMIT 1", (ref,)
                ).fetchone()
            if row is None and ref:
                ids = [r["id"] for r in db.execute("SELECT id FROM runs") if r["id"].startswith(ref)]
                if len(ids) > 1:
                    listed = ", ".join(sorted(ids)[:8])
                    raise RunNotFound(
                        f"{ref!r} is the start of several run ids ({listed}): give more of it",
                        f"{ref!r} 是多个运行 id 的开头（{listed}）：请多写几位",
                    )
                if ids:
                    row = db.execute("SELECT * FROM runs WHERE id = ?", (ids[0],)).fetchone()
            if row is None:
                raise RunNotFound(
                    f"no run has the name or id {ref!r} (see trainguard ps)",
                    f"没有名称或 id 为 {ref!r} 的运行（见 trainguard ps）",
                )
            return self._run_from(db, row)

    @_registry_errors
    def all(self) -> list[Run]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY created_at DESC").fetchall()
            return [self._run_from(db, row) for row in rows]


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _load(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


ACTIVE = ("starting", "running", "backoff", "stopping")


def close_runs_lost_to_reboot(registry: Registry, current_boot: str | None = None) -> list[str]:
    """Runs recorded as active under an earlier boot of this machine died with it: close them with
    cause node_reboot. Returns their ids."""
    current_boot = current_boot or boot_id()
    if current_boot is None:
        return []
    closed = []
    host = socket.gethostname()
    for run in registry.all():
        if run.state not in ACTIVE or run.boot_id in (None, current_boot) or run.host != host:
            continue
        if run.attempts and run.attempts[-1].ended_at is None:
            last = run.attempts[-1]
            last.ended_at = time.time()
            last.cause = "node_reboot"
            last.confidence = 1.0
            registry.end_attempt(run.id, last)
        registry.set_state(
            run.id,
            "failed",
            reason=Text(
                "the machine went down under the job (node_reboot); `trainguard restart RUN` resumes it from its checkpoint",
                "作业运行期间机器宕机（node_reboot）；用 `trainguard restart RUN` 从检查点继续",
            ),
        )
        closed.append(run.id)
    return closed
