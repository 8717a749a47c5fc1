"""The supervisor's record of its run, kept in memory first and written to the registry second.

Supervision must not depend on the state disk: when the registry cannot be written (the disk is
full, the database read-only or removed) the supervisor goes on watching, restarting and stopping
the job. Writes that fail wait in a queue and are retried on every tick, in order; the problem is
reported once (syslog and the supervisor's own log) and once more when it is over. A write that
fails for want of room first asks for room: the run's logs give back what they can spare
(``room_makers``), and the records that say how a run goes on or ends (its state, its attempts)
may use the state disk's reserve (``space_reserve``), so a full disk never leaves a run's end unwritten
while the supervisor could make room for it. When the state
folder was removed under the run, the registry is recreated and the whole run written back, so
`trainguard ps` sees it again.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard._i18n import Text
from trainguard.store.registry import Attempt, Registry, RegistryError, Run
from trainguard.store.space_reserve import SpaceReserve

log = logging.getLogger("trainguard.supervisor")

MAX_QUEUED = 10_000  # events beyond this are dropped (the oldest first); states and attempts are rewritten whole
RETRY_EVERY_S = 2.0


def _report(message: str) -> None:
    """Once per episode: the supervisor's log (stderr) and the system log, where there is one."""
    with contextlib.suppress(OSError, ValueError):
        print(f"trainguard supervisor: {message}", file=sys.stderr, flush=True)
    try:
        import syslog

        syslog.openlog("trainguard", syslog.LOG_PID, syslog.LOG_USER)
        syslog.syslog(syslog.LOG_WARNING, message)
    except (ImportError, OSError):
        pass


class Journal:
    def __init__(self, registry: Registry, run: Run, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.run = run
        self.clock = clock
        self._queue: deque[tuple[Callable[[], None], bool]] = deque()  # (write, whether it is vital)
        self._failing_since: float | None = None
        self._next_retry = 0.0
        # Called when the state disk is full, before the reserve: each frees what it can, in bytes.
        self.room_makers: list[Callable[[], int]] = []
        self.reserve = SpaceReserve(registry.state_dir, clock=clock)
        self.reserve.keep()

    # ------------------------------------------------------------------ writing
    def _write(self, op: Callable[[], None], *, vital: bool = False) -> None:
        """``vital``: a record of how the run goes on or ends (its state, an attempt), which may use
        the state disk's reserve; an event may not."""
        if self._queue:  # keep the order: nothing jumps ahead of what is already waiting
            self._enqueue(op, vital)
            self.flush(force=vital)
            return
        try:
            op()
        except RegistryError as exc:
            self._enqueue(op, vital)
            if not (exc.disk_full and self._make_room() and self.flush(force=True)):
                self._failed(exc)

    def _enqueue(self, op: Callable[[], None], vital: bool) -> None:
        self._queue.append((op, vital))
        while len(self._queue) > MAX_QUEUED:
            oldest = next((i for i, (_, is_vital) in enumerate(self._queue) if not is_vital), 0)
            del self._queue[oldest]  # an event goes before a state or an attempt does

    def _make_room(self) -> bool:
        """Room on a full state disk for what waits: what the run's logs can spare, else (for a
        vital record only) the reserve. Whether any was made."""
        freed = 0
        for make_room in self.room_makers:
            with contextlib.suppress(Exception):  # making room is a help, never a new way to fail
                freed += make_room()
        if freed == 0 and any(vital for _, vital in self._queue):
            freed = self.reserve.spend()
            if freed:
                _report(f"run {self.run.id}: the state disk is full; its reserve ({freed >> 10} KiB) is used for "
                        "the run's records")  # fmt: skip
        return freed > 0

    def _failed(self, exc: RegistryError) -> None:
        if self._failing_since is None:
            self._failing_since = time.time()
            _report(
                f"run {self.run.id}: cannot write the run registry ({exc.message_en}); "
                "supervision goes on, the records are kept in memory and written when it works again"
            )
        self._next_retry = self.clock() + RETRY_EVERY_S

    def flush(self, *, force: bool = False) -> bool:
        """Write what is waiting; True when nothing is left. Called on every tick of the supervisor."""
        if not force and self._queue and self.clock() < self._next_retry:
            return False
        if self.registry.replaced():
            self._recreate()
        room_asked = False
        while self._queue:
            try:
                self._queue[0][0]()
            except RegistryError as exc:
                if exc.disk_full and not room_asked:
                    room_asked = True
                    if self._make_room():
                        continue
                self._failed(exc)
                return False
            self._queue.popleft()
        if self._failing_since is not None:
            _report(f"run {self.run.id}: the run registry can be written again")
            self._failing_since = None
        self.reserve.keep()
        return True

    def drain(self, give_up: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> bool:
        """At the end of the run: write what is waiting, however long the registry takes to work
        again (this process holds the only copy). Told once; ``give_up`` (a stop signal) ends the
        wait. Whether everything was written."""
        if self.flush(force=True):
            return True
        _report(
            f"run {self.run.id} has ended ({self.run.state}) but its last records cannot be written yet; this "
            "supervisor waits and writes them as soon as the state folder can be written (two stop signals give up)"
        )
        while not give_up():
            sleep(RETRY_EVERY_S)
            if self.flush(force=True):
                return True
        _report(f"run {self.run.id}: gave up writing its last records; the registry does not show how it ended")
        return False

    def _recreate(self) -> None:
        """The state folder (or the database) was removed under the run: make it anew and put the
        run back, so it stays visible to `trainguard ps`."""
        try:
            Path(self.run.run_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            self.registry.reopen()
            self.registry.restore_run(self.run)
        except (RegistryError, OSError) as exc:
            self._failed(exc if isinstance(exc, RegistryError) else RegistryError(str(exc)))
            return
        _report(f"run {self.run.id}: the run registry was removed under the run; recreated it")

    @property
    def healthy(self) -> bool:
        return not self._queue

    # ------------------------------------------------------------------ what the supervisor records
    def set_state(self, state: str, reason: Text | None = None, data: dict[str, Any] | None = None) -> None:
        self.run.state = state
        if reason is not None:
            self.run.reason, self.run.reason_zh = reason
        self._write(lambda: self.registry.set_state(self.run.id, state, reason=reason, data=data), vital=True)

    def update(self, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(self.run, key, value)
        self._write(lambda: self.registry.update_run(self.run.id, **fields))

    def event(self, kind: str, data: dict[str, Any], *, at: float | None = None) -> None:
        at = time.time() if at is None else at
        self._write(lambda: self.registry.event(self.run.id, kind, data, at=at))

    def start_attempt(self, attempt: Attempt) -> None:
        self.run.attempts.append(attempt)
        self.run.job_pid, self.run.job_start = attempt.pid, attempt.pid_start
        self._write(lambda: self.registry.start_attempt(self.run.id, attempt), vital=True)

    def end_attempt(self, attempt: Attempt) -> None:
        self._write(lambda: self.registry.end_attempt(self.run.id, attempt), vital=True)

    def save_progress(self, attempt: Attempt) -> None:
        progress = dict(attempt.progress or {})
        self._write(lambda: self.registry.save_progress(self.run.id, attempt.n, progress))

    # Samples are many and each is worth little: one that cannot be written is dropped, not queued.
    def add_sample(self, run_id: str, sample_time: float, data: dict[str, Any]) -> None:
        if self._queue:
            return
        try:
            self.registry.add_sample(run_id, sample_time, data)
        except RegistryError as exc:
            self._failed(exc)

    def downsample(self, run_id: str, now: float) -> None:
        with contextlib.suppress(RegistryError):
            if not self._queue:
                self.registry.downsample(run_id, now)

    def checkpoints_recorded(self) -> dict[str, float]:
        """The checkpoints an earlier supervisor of this run recorded (path -> when written)."""
        try:
            events = self.registry.events(self.run.id)
        except RegistryError:
            return {}
        return {e["path"]: e["time"] for e in events if e["kind"] == "checkpoint" and e.get("path")}

    def stop_request(self) -> dict[str, Any] | None:
        """What `trainguard stop` asked for (its grace), read fresh; None when it cannot be read."""
        try:
            current = self.registry.get(self.run.id)
        except RegistryError:
            return None
        return current.stop_request if current else None

    def clear_stop_request(self) -> None:
        if self.run.stop_request is not None or self.stop_request() is not None:
            self.update(stop_request=None)
