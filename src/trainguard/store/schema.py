"""The registry's tables, and the columns added since the first release: a registry written by
an older trainguard is brought up to date when it is opened."""

from __future__ import annotations

import re
import sqlite3

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

_SCHEMA_OBJECTS = frozenset(re.findall(r"CREATE (?:TABLE|INDEX) IF NOT EXISTS ([a-z_]+)", SCHEMA))


def schema_is_current(db: sqlite3.Connection) -> bool:
    """Every table, index and column this version uses exists."""
    if not _SCHEMA_OBJECTS.issubset(row["name"] for row in db.execute("SELECT name FROM sqlite_master")):
        return False
    for table, columns in MIGRATIONS.items():
        if not set(columns) <= {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}:
            return False
    return True


def apply_schema(db: sqlite3.Connection) -> None:
    """Creates what is missing: tables, indexes, and the columns of MIGRATIONS (inside the caller's
    write transaction)."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    for table, columns in MIGRATIONS.items():
        have = {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}
        for column, kind in columns.items():
            if column not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
