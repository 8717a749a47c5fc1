"""The run registry: runs, their attempts and every state change, in SQLite (WAL) under the state
dir, safe with several supervisors writing and any number of readers."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import UsageError

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
    attempts: list[Attempt] = field(default_factory=list)


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


class Registry:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._db: sqlite3.Connection | None = None
        self._db_pid = 0
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.db_path = state_dir / "runs.sqlite"
            with self._connect() as db:
                db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise UsageError(
                f"cannot use the state folder {state_dir}: {exc} (set TRAINGUARD_HOME to a writable folder)",
                f"无法使用状态目录 {state_dir}：{exc}（请把 TRAINGUARD_HOME 设为可写目录）",
            ) from exc

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One connection per process, kept open: a supervisor writes a handful of events between a
        job's death and its restart, and opening the database for each cost ~2 ms."""
        if self._db is None or self._db_pid != os.getpid():
            db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            # In WAL mode NORMAL never corrupts the database; a power cut may lose the last few
            # events, and each state change stops costing an fsync.
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=30000")
            db.row_factory = sqlite3.Row
            self._db, self._db_pid = db, os.getpid()
        yield self._db

    # ------------------------------------------------------------------ runs
    def create_run(self, command: list[str], *, name: str | None, cwd: str, options: dict[str, Any]) -> Run:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                while True:
                    run_id = secrets.token_hex(4)
                    if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                        break
                run_dir = self.state_dir / "runs" / run_id
                run_dir.mkdir(parents=True, mode=0o700)
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
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return run

    def update_run(self, run_id: str, **fields: Any) -> None:
        columns = ", ".join(f"{key} = ?" for key in fields)
        with self._connect() as db:
            db.execute(f"UPDATE runs SET {columns} WHERE id = ?", (*fields.values(), run_id))

    def set_state(
        self, run_id: str, state: str, *, reason: str | None = None, data: dict[str, Any] | None = None
    ) -> None:
        now = time.time()
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE runs SET state = ?, reason = COALESCE(?, reason) WHERE id = ?", (state, reason, run_id))
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, ?, ?)",
                (run_id, now, f"state:{state}", json.dumps({"reason": reason, **(data or {})})),
            )
            db.execute("COMMIT")

    def event(self, run_id: str, kind: str, data: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, ?, ?)",
                (run_id, time.time(), kind, json.dumps(data)),
            )

    def events(self, run_id: str) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute("SELECT time, kind, data FROM events WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
        return [{"time": r["time"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    # ------------------------------------------------------------------ attempts
    def start_attempt(self, run_id: str, attempt: Attempt) -> None:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO attempts (run_id, n, started_at, pid, resumed_from, log_offset) VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, attempt.n, attempt.started_at, attempt.pid, attempt.resumed_from, attempt.log_offset),
            )
            db.execute("UPDATE runs SET job_pid = ? WHERE id = ?", (attempt.pid, run_id))
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, 'attempt_started', ?)",
                (run_id, attempt.started_at,
                 json.dumps({"n": attempt.n, "pid": attempt.pid, "resumed_from": attempt.resumed_from})),
            )  # fmt: skip
            db.execute("COMMIT")

    def end_attempt(self, run_id: str, attempt: Attempt) -> None:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "UPDATE attempts SET ended_at = ?, exit_code = ?, signal = ?, cause = ?, confidence = ?, diagnosis = ?"
                " WHERE run_id = ? AND n = ?",
                (attempt.ended_at, attempt.exit_code, attempt.signal, attempt.cause, attempt.confidence,
                 json.dumps(attempt.diagnosis) if attempt.diagnosis else None, run_id, attempt.n),
            )  # fmt: skip
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, 'attempt_ended', ?)",
                (run_id, attempt.ended_at, json.dumps({"n": attempt.n, "exit_code": attempt.exit_code,
                 "signal": attempt.signal, "cause": attempt.cause, "confidence": attempt.confidence})),
            )  # fmt: skip
            db.execute("COMMIT")

    # ------------------------------------------------------------------ samples
    def add_sample(self, run_id: str, sample_time: float, data: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO samples (run_id, time, data) VALUES (?, ?, ?)", (run_id, sample_time, json.dumps(data))
            )

    def samples(self, run_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute("SELECT data FROM samples WHERE run_id = ? AND time >= ? ORDER BY time", (run_id, since))
            return [json.loads(row["data"]) for row in rows]

    def downsample(self, run_id: str, now: float) -> None:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            for age, bucket in DOWNSAMPLING:
                db.execute(
                    "DELETE FROM samples WHERE run_id = ? AND time < ? AND id NOT IN ("
                    " SELECT MIN(id) FROM samples WHERE run_id = ? AND time < ? GROUP BY CAST(time / ? AS INTEGER))",
                    (run_id, now - age, run_id, now - age, bucket),
                )
            db.execute("COMMIT")

    # ------------------------------------------------------------------ reading
    def _run_from(self, db: sqlite3.Connection, row: sqlite3.Row) -> Run:
        run = Run(
            id=row["id"], name=row["name"], host=row["host"], command=json.loads(row["command"]), cwd=row["cwd"],
            created_at=row["created_at"], state=row["state"], run_dir=row["run_dir"], log_path=row["log_path"],
            options=json.loads(row["options"]), reason=row["reason"], supervisor_pid=row["supervisor_pid"],
            job_pid=row["job_pid"], boot_id=row["boot_id"],
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
                    diagnosis=json.loads(a["diagnosis"]) if a["diagnosis"] else None,
                )
            )
        return run

    def get(self, run_id: str) -> Run | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            return self._run_from(db, row) if row else None

    def resolve(self, ref: str) -> Run:
        """A run by id, unique id prefix, or name (the newest run of that name)."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (ref,)).fetchone()
            if row is None:
                rows = db.execute("SELECT * FROM runs WHERE id LIKE ? || '%'", (ref,)).fetchall()
                if len(rows) == 1:
                    row = rows[0]
            if row is None:
                row = db.execute(
                    "SELECT * FROM runs WHERE name = ? ORDER BY created_at DESC LIMIT 1", (ref,)
                ).fetchone()
            if row is None:
                raise UsageError(f"no run {ref!r} (see trainguard ps)", f"没有运行 {ref!r}（见 trainguard ps）")
            return self._run_from(db, row)

    def all(self) -> list[Run]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY created_at DESC").fetchall()
            return [self._run_from(db, row) for row in rows]


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
            reason="the machine went down under the job (node_reboot); start it again to resume from its checkpoint",
        )
        closed.append(run.id)
    return closed
