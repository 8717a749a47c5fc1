"""Save requests: the supervisor asks a running job to save now, before a death it sees coming (its
memory, /dev/shm or the checkpoint disk running out), and then to go on training or to stop (the
planned restart of a leaking job). A file channel, so that a job whose library predates it never
looks and is not disturbed:

    TRAINGUARD_SAVE_REQUEST_FILE=<path>       set by the supervisor, a path of each attempt's own
    {"id": 3, "time": 1718000000.5, "reason": "RAM runs out in 40 s", "then": "continue"}

The supervisor replaces the file atomically (a temporary file renamed over it), each new request
with a larger ``id``; ``time`` is when it was made (seconds since the epoch), ``then`` is
``"continue"`` (the default) or ``"stop"``. The job looks at the file at its step ends, at most once
every ``CHECK_EVERY_S`` (one ``stat``; the file is read only when it changed, never followed into a
FIFO or a device, and never waited for), takes one save at its next step end (every rank of a job of
several at one step, as for a stop signal) and, once a checkpoint taken after the request is on
disk, reports ``save_request_done`` (the id), ``save_request_step`` and ``save_request_time`` in its
progress file (``trainguard.progress``). With ``"then": "stop"`` that save is the stop save of
SIGUSR1: the loop leaves (``stop_requested``) and ``stop_signal`` 10 is reported. A request made
before the process started (an earlier attempt's, or an earlier run of torchrun's workers) and an
id no larger than one already read are ignored.

Used by ``Checkpointer`` and by the framework integrations (``trainguard.integrations``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard import _untrusted as untrusted
from trainguard import progress

log = logging.getLogger("trainguard.checkpoint")

SAVE_REQUEST_FILE_ENV = "TRAINGUARD_SAVE_REQUEST_FILE"
CHECK_EVERY_S = 0.5
MAX_REQUEST_BYTES = 64 * 1024
STOP_SIGNAL = int(signal.SIGUSR1)  # "then": "stop" stops the job as the pre-timeout signal does
START_SLACK_S = 1.0  # the boot time /proc gives is whole seconds
_IMPORTED_AT = time.time()


@dataclass(frozen=True)
class SaveRequest:
    id: int
    time: float
    reason: str
    stop: bool  # "then": "stop"


def parse_request(value: Any) -> SaveRequest | None:
    """The request a file's JSON holds, or None when it is not one (the job never fails on it)."""
    if not isinstance(value, dict) or not untrusted.is_int(value.get("id")):
        return None
    if not untrusted.is_number(value.get("time")):
        return None
    reason = value.get("reason")
    return SaveRequest(value["id"], float(value["time"]), reason[:500] if untrusted.is_text(reason) else "",
                       value.get("then") == "stop")  # fmt: skip


def process_start_time() -> float:
    """When this process started (seconds since the epoch), from /proc; else when this was imported."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))  # fmt: skip
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


def write_request(path: str, request: SaveRequest) -> None:
    """Make ``request`` (the supervisor's side): written next to ``path`` and renamed over it, so a
    job never reads half of one. Raises OSError (a full disk: the request is not made)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    then = "stop" if request.stop else "continue"
    body = {"id": request.id, "time": request.time, "reason": request.reason, "then": then}
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(body, file)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class SaveRequests:
    """One process's side of the request file: which request still needs its save taken
    (``check``, cheap at every step end), which one a save in flight answers, which one is done."""

    def __init__(self, path: str | None = None, *, clock: Callable[[], float] = time.monotonic,
                 check_every_s: float = CHECK_EVERY_S, not_before: float | None = None) -> None:  # fmt: skip
        self.path = path if path is not None else os.environ.get(SAVE_REQUEST_FILE_ENV) or None
        self.pending: SaveRequest | None = None  # read, its save not yet taken
        self.answering: SaveRequest | None = None  # its save taken, not yet on disk
        self.done: SaveRequest | None = None
        self._clock = clock
        self._check_every_s = check_every_s
        self._checked_at = -math.inf
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of the file last read
        self._highest = -1
        self._not_before = (process_start_time() - START_SLACK_S) if not_before is None else not_before

    def check(self) -> SaveRequest | None:
        """The request whose save is still to be taken, or None. Never blocks."""
        if self.path is not None:
            now = self._clock()
            if now - self._checked_at >= self._check_every_s:
                self._checked_at = now
                self._look()
        return self.pending

    def _look(self) -> None:
        try:
            status = os.stat(self.path)
        except OSError:
            return  # no request made yet
        seen = (status.st_ino, status.st_size, status.st_mtime_ns)
        if seen == self._seen:
            return
        self._seen = seen
        value = untrusted.load_json(self.path, MAX_REQUEST_BYTES)  # a FIFO, a device, garbage: None, said once
        request = parse_request(value)
        if request is None:
            if value is not None:
                untrusted.warn_once(self.path, 'not a save request ({"id": N, "time": T, ...})')
            return
        if request.id <= self._highest:
            return
        self._highest = request.id
        if request.time < self._not_before:
            log.info("save request %d was made before this process started: not for it", request.id)
            return
        self.pending = request
        reason = f" ({request.reason})" if request.reason else ""
        log.warning("save request %d%s: saving at the next step end%s", request.id, reason,
                    ", then stopping" if request.stop else "")  # fmt: skip

    def taken(self) -> None:
        """A save starts now: once on disk, it answers the pending request."""
        if self.pending is not None:
            self.answering, self.pending = self.pending, None

    def saved(self, step: int, saved_at: float | None = None) -> None:
        """A save taken since ``taken`` is on disk: the request it answers is done, and reported."""
        if self.answering is None:
            return
        self.done, self.answering = self.answering, None
        progress.report_save_request_done(self.done.id, step, saved_at)
