"""A run and its attempts as the registry hands them out, and how they are read from its rows
(the JSON columns decoded, a damaged one read as missing)."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

# The states of a live run, as the rows hold them (states.ACTIVE_STATES as plain strings).
ACTIVE = ("starting", "running", "backoff", "stopping")


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

    @property
    def ref(self) -> str:
        """How a person types this run in a command it is told: its name where a shell and the
        command line read it as it is (`--name "a b"` or `--name -x` would not be), else its id."""
        name = self.name
        if name and re.fullmatch(r"[A-Za-z0-9_.:@%+=,][A-Za-z0-9_.:@%+=,/-]*", name):
            return name
        return self.id


def run_from_row(db: sqlite3.Connection, row: sqlite3.Row) -> Run:
    """The run of a ``runs`` row, with its attempts read from ``db``."""
    run = Run(
        id=row["id"], name=row["name"], host=row["host"], command=json.loads(row["command"]), cwd=row["cwd"],
        created_at=row["created_at"], state=row["state"], run_dir=row["run_dir"], log_path=row["log_path"],
        options=json.loads(row["options"]), reason=row["reason"], supervisor_pid=row["supervisor_pid"],
        job_pid=row["job_pid"], boot_id=row["boot_id"], supervisor_start=row["supervisor_start"],
        job_start=row["job_start"], containment=row["containment"],
        stop_request=from_json(row["stop_request"]), reason_zh=row["reason_zh"],
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
                diagnosis=from_json(a["diagnosis"]),
                pid_start=a["pid_start"],
                log_path=a["log_path"],
                containment=from_json(a["containment"]),
                progress=from_json(a["progress"]),
                skipped=from_json(a["skipped"]),
            )
        )
    return run


def to_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def from_json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
