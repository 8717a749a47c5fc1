"""The run registry: runs, their attempts, every state change and the resource samples, in SQLite
under the state dir, safe with several supervisors writing and any number of readers.

How the database is opened, locked and kept private is :mod:`trainguard.store.database`'s; its
tables are :mod:`trainguard.store.schema`'s, the records it hands out :mod:`trainguard.store.records`'s.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard._i18n import Text
from trainguard.errors import UsageError
from trainguard.paths import check_trusted
from trainguard.store.database import Database, RegistryError, private_dir, registry_errors
from trainguard.store.records import ACTIVE, Attempt, Run, run_from_row, to_json

# What callers import from here, the records' and the database's error among them.
__all__ = [
    "Attempt",
    "NameInUse",
    "Registry",
    "RegistryError",
    "Run",
    "RunNotFound",
    "boot_id",
    "close_runs_lost_to_reboot",
]

# Samples thin out with age: every one for the last 15 minutes (the minutes before a death matter
# most), one a minute for a day, one every ten minutes after that.
DOWNSAMPLING = ((15 * 60, 60), (24 * 3600, 600))


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


class RunNotFound(UsageError):
    pass


class NameInUse(UsageError):
    def __init__(self, name: str, run_id: str) -> None:
        super().__init__(
            f"a run named {name!r} is still active ({run_id}): stop it first, or choose another --name",
            f"名为 {name!r} 的运行仍在进行（{run_id}）：请先停止它，或换一个 --name",
        )
        self.run_id = run_id


class Registry(Database):
    """The runs recorded under ``state_dir``: written by supervisors, read by every command."""

    # ------------------------------------------------------------------ runs
    @registry_errors
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
                private_dir(run_dir.parent)
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

    @registry_errors
    def delete_run(self, run_id: str) -> None:
        """Forget a run that never started (its supervisor could not start): record and folder."""
        run = self.get(run_id)
        with self._transaction() as db:
            _delete_records(db, run_id)
        if run is not None:
            shutil.rmtree(run.run_dir, ignore_errors=True)

    @registry_errors
    def forget_ended_run(self, run_id: str) -> bool:
        """Delete an ended run's records (the run, its attempts, events and samples) in one
        transaction; its files are the caller's to remove. False, with nothing deleted, when the run
        is gone or active again (continued since the caller looked)."""
        with self._transaction() as db:
            row = db.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None or row["state"] in ACTIVE:
                return False
            _delete_records(db, run_id)
        return True

    @registry_errors
    def update_run(self, run_id: str, **fields: Any) -> None:
        columns = ", ".join(f"{key} = ?" for key in fields)
        values = [json.dumps(v) if isinstance(v, (dict, list)) else v for v in fields.values()]
        with self._connect() as db:
            db.execute(f"UPDATE runs SET {columns} WHERE id = ?", (*values, run_id))

    def request_stop(self, run_id: str, grace_s: float, *, replace_stale: bool = False) -> bool:
        """Record that `trainguard stop` asked this run to stop (in the state disk's reserve if it is
        full); False when another stop asked first (``replace_stale``: the earlier request has nobody
        left to act on it)."""
        return self.in_reserve(lambda: self._request_stop(run_id, grace_s, replace_stale))

    @registry_errors
    def _request_stop(self, run_id: str, grace_s: float, replace_stale: bool) -> bool:
        request = json.dumps({"time": time.time(), "grace_s": grace_s})
        condition = "" if replace_stale else " AND stop_request IS NULL"
        with self._connect() as db:
            updated = db.execute(f"UPDATE runs SET stop_request = ? WHERE id = ?{condition}", (request, run_id))
            return updated.rowcount == 1

    @registry_errors
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

    @registry_errors
    def event(self, run_id: str, kind: str, data: dict[str, Any], *, at: float | None = None) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, ?, ?)",
                (run_id, time.time() if at is None else at, kind, json.dumps(data)),
            )

    @registry_errors
    def events(self, run_id: str, kinds: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """The run's events in the order they were recorded; only those of ``kinds`` when given."""
        query = "SELECT time, kind, data FROM events WHERE run_id = ?"
        if kinds is not None:
            query += f" AND kind IN ({','.join('?' * len(kinds))})"
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY id", (run_id, *(kinds or ()))).fetchall()
        return [{"time": r["time"], "kind": r["kind"], **json.loads(r["data"])} for r in rows]

    @registry_errors
    def latest_event(self, run_id: str, kind: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT time, kind, data FROM events WHERE run_id = ? AND kind = ? ORDER BY id DESC LIMIT 1",
                (run_id, kind),
            ).fetchone()
        return {"time": row["time"], "kind": row["kind"], **json.loads(row["data"])} if row else None

    # ------------------------------------------------------------------ attempts
    @registry_errors
    def start_attempt(self, run_id: str, attempt: Attempt) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO attempts (run_id, n, started_at, pid, pid_start, resumed_from, log_offset,"
                " log_path, containment, skipped) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, attempt.n, attempt.started_at, attempt.pid, attempt.pid_start, attempt.resumed_from,
                 attempt.log_offset, attempt.log_path, to_json(attempt.containment), to_json(attempt.skipped)),
            )  # fmt: skip
            db.execute("UPDATE runs SET job_pid = ?, job_start = ? WHERE id = ?",
                       (attempt.pid, attempt.pid_start, run_id))  # fmt: skip
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, 'attempt_started', ?)",
                (run_id, attempt.started_at,
                 json.dumps({"n": attempt.n, "pid": attempt.pid, "resumed_from": attempt.resumed_from})),
            )  # fmt: skip

    @registry_errors
    def end_attempt(self, run_id: str, attempt: Attempt) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE attempts SET ended_at = ?, exit_code = ?, signal = ?, cause = ?, confidence = ?, diagnosis = ?,"
                " progress = ?, containment = ? WHERE run_id = ? AND n = ?",
                (attempt.ended_at, attempt.exit_code, attempt.signal, attempt.cause, attempt.confidence,
                 to_json(attempt.diagnosis), to_json(attempt.progress), to_json(attempt.containment), run_id,
                 attempt.n),
            )  # fmt: skip
            db.execute(
                "INSERT INTO events (run_id, time, kind, data) VALUES (?, ?, 'attempt_ended', ?)",
                (run_id, attempt.ended_at, json.dumps({"n": attempt.n, "exit_code": attempt.exit_code,
                 "signal": attempt.signal, "cause": attempt.cause, "confidence": attempt.confidence})),
            )  # fmt: skip

    @registry_errors
    def save_progress(self, run_id: str, n: int, progress: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute("UPDATE attempts SET progress = ? WHERE run_id = ? AND n = ?", (to_json(progress), run_id, n))

    @registry_errors
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
                     a.confidence, a.resumed_from, a.log_offset, a.log_path, to_json(a.diagnosis),
                     to_json(a.containment), to_json(a.progress), to_json(a.skipped)),
                )  # fmt: skip

    # ------------------------------------------------------------------ samples
    @registry_errors
    def add_sample(self, run_id: str, sample_time: float, data: dict[str, Any]) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO samples (run_id, time, data) VALUES (?, ?, ?)", (run_id, sample_time, json.dumps(data))
            )

    @registry_errors
    def samples(self, run_id: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._connect() as db:
            rows = db.execute("SELECT data FROM samples WHERE run_id = ? AND time >= ? ORDER BY time", (run_id, since))
            return [json.loads(row["data"]) for row in rows]

    @registry_errors
    def latest_sample(self, run_id: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT data FROM samples WHERE run_id = ? ORDER BY time DESC LIMIT 1", (run_id,)
            ).fetchone()
        return json.loads(row["data"]) if row else None

    @registry_errors
    def downsample(self, run_id: str, now: float) -> None:
        with self._transaction() as db:
            for age, bucket in DOWNSAMPLING:
                db.execute(
                    "DELETE FROM samples WHERE run_id = ? AND time < ? AND id NOT IN ("
                    " SELECT MIN(id) FROM samples WHERE run_id = ? AND time < ? GROUP BY CAST(time / ? AS INTEGER))",
                    (run_id, now - age, run_id, now - age, bucket),
                )

    # ------------------------------------------------------------------ reading
    @registry_errors
    def get(self, run_id: str) -> Run | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
            return self._trusted(run_from_row(db, row)) if row else None

    def _trusted(self, run: Run) -> Run:
        """A run whose folder is in this state folder (not reached through a symlink out of it) and
        can be changed by nobody else."""
        check_trusted(Path(run.run_dir), within=self.state_dir / "runs")
        return run

    @registry_errors
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
            return self._trusted(run_from_row(db, row))

    @registry_errors
    def all(self) -> list[Run]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY created_at DESC").fetchall()
            return [self._trusted(run_from_row(db, row)) for row in rows]

    @registry_errors
    def ended_times(self) -> dict[str, float]:
        """Each ended run's id and when it ended: its last change of state (its creation when it has
        none recorded)."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT r.id, COALESCE(MAX(e.time), r.created_at) AS ended FROM runs r"
                " LEFT JOIN events e ON e.run_id = r.id AND e.kind LIKE 'state:%'"
                f" WHERE r.state NOT IN ({','.join('?' * len(ACTIVE))}) GROUP BY r.id",
                ACTIVE,
            ).fetchall()
        return {row["id"]: row["ended"] for row in rows}

    @registry_errors
    def unrecorded_run_folders(self) -> list[Path]:
        """The folders under runs/ that no run records: what a removal cut short left behind (the
        record goes before the files). Listed while holding the write lock: a run being created makes
        its folder and its record in one transaction, so it is never taken for one of these."""
        runs = self.state_dir / "runs"
        with self._transaction() as db:
            recorded = {row["id"] for row in db.execute("SELECT id FROM runs")}
            try:
                entries = list(os.scandir(runs))
            except FileNotFoundError:
                return []
        return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False) and e.name not in recorded)


def _delete_records(db: sqlite3.Connection, run_id: str) -> None:
    for table in ("events", "samples", "attempts"):
        db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
    db.execute("DELETE FROM runs WHERE id = ?", (run_id,))


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
