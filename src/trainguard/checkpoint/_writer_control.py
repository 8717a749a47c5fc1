"""The training process's side of the writer process (``_writer``): starting it, handing it a staged
save, waiting for that save without ever waiting on a stuck writer, and stopping it."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from trainguard.checkpoint._format import CheckpointError

log = logging.getLogger("trainguard.checkpoint")

# A writer that shows no sign of work on the save in flight (no CPU time, no bytes through its system
# calls, no wake-up) for this many times the last save's duration, and at least STUCK_MIN_S, is stuck
# (stopped, hung on a dead mount): it is killed, and training never waits. A slow writer that keeps
# working (a CPU limit, a loaded machine, a slow disk) is never killed for being slow.
STUCK_FACTOR = 3.0
STUCK_MIN_S = 5.0
# How often the writer's activity is read from /proc while a save is in flight.
ACTIVITY_SAMPLE_S = 0.2


class WriterProcess:
    """The persistent writer process and the one save it may have in flight."""

    def __init__(self, staging_fd: int) -> None:
        parent, child = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainguard.checkpoint._writer", str(child.fileno()), str(staging_fd)],
            pass_fds=(child.fileno(), staging_fd),
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.connection = Connection(parent.detach())
        self.in_flight: dict[str, Any] | None = None
        self.submitted_at = 0.0
        self._active_at = 0.0  # when the writer last showed a sign of work
        self._sampled_at = 0.0
        self._activity: int | None = None

    def submit(self, job: dict[str, Any], *, tree: bytes) -> None:
        """Hand the writer a staged save. ``tree`` stays here, kept to write the save in this process
        should the writer get stuck or die; the writer reads its own copy from the staging buffer."""
        self.in_flight = {**job, "tree": tree}
        self.submitted_at = self._active_at = self._sampled_at = time.monotonic()
        self._activity = self.activity()
        try:
            self.connection.send(job)
        except OSError as exc:  # it died after it was last seen alive (EPIPE, ECONNRESET)
            raise WriterStuck(self.in_flight, died=True) from exc

    def in_flight_for(self) -> float:
        return time.monotonic() - self.submitted_at if self.in_flight is not None else 0.0

    def activity(self) -> int | None:
        """A count that grows whenever the writer does anything: CPU time, bytes through its system
        calls, wake-ups (each page an fsync waits for is one). None where /proc cannot tell."""
        pid = self.process.pid
        total, known = 0, False
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            known = True
        for name, keys in (("status", ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")),
                           ("io", ("rchar", "wchar"))):  # fmt: skip
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key in keys:
                        total += int(value)
                        known = True
        return total if known else None

    def idle_for(self) -> float:
        """How long the save in flight has gone without a sign of work from the writer (since it was
        submitted, where /proc cannot tell); 0 when none is in flight."""
        if self.in_flight is None:
            return 0.0
        now = time.monotonic()
        if now - self._sampled_at >= ACTIVITY_SAMPLE_S:
            self._sampled_at = now
            activity = self.activity()
            if activity is not None and activity != self._activity:
                self._activity, self._active_at = activity, now
        return now - self._active_at

    def wait(self, patience_s: float | None = None) -> Path | None:
        """The path of the save in flight once it is on disk; raises WriterStuck when the writer
        showed no sign of work for ``patience_s``, or died before it answered (the save is still
        staged). A writer that keeps working is waited for, however slow."""
        job = self.in_flight
        if job is None:
            return None
        try:
            if patience_s is not None:
                while not self.connection.poll(max(0.0, min(2 * ACTIVITY_SAMPLE_S, patience_s - self.idle_for()))):
                    if self.idle_for() >= patience_s:
                        raise WriterStuck(job)
            reply = self.connection.recv()
        except (EOFError, OSError) as exc:
            raise WriterStuck(job, died=True) from exc
        self.in_flight = None
        if not reply["ok"]:
            raise CheckpointError(reply["error"])
        self.last_save_s = float(reply.get("seconds", time.monotonic() - self.submitted_at))
        return Path(reply["path"])

    last_save_s = 0.0  # how long the writer took over its last save, by its own clock

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.connection.close()

    def done(self) -> bool:
        """Whether the save in flight has finished (its reply is waiting), without blocking."""
        return self.in_flight is None or self.connection.poll()

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout_s: float) -> bool:
        """Stop the writer once it is done pruning; killed when it does not exit within ``timeout_s``
        (SIGSTOPped, hung on a dead mount): whether it had to be."""
        # Said, not implied by closing the socket: processes forked from the trainer (DataLoader
        # workers) hold copies of it, so the writer would wait for an EOF that never comes.
        with contextlib.suppress(OSError, ValueError):
            self.connection.send({"exit": True})
        self.connection.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return True
        return False

    def abandon(self, *, died: bool = False) -> dict[str, Any] | None:
        """Kill a writer that stopped answering (SIGSTOPped, hung on a dead mount), or reap one that
        died. Returns the save it never finished."""
        job = self.in_flight
        step = job["step"] if job else "?"
        if died:
            log.warning("the checkpoint writer process died while saving step %s; a new one takes over", step)
        else:
            log.warning("the checkpoint writer did not finish step %s in %.0f s, nor show any sign of work for "
                        "%.0f s: killed; a new one takes over",
                        step, self.in_flight_for(), self.idle_for())  # fmt: skip
        self.kill()
        return job


class WriterStuck(Exception):
    """The writer process did not finish a save in time, or ``died`` before it did; ``job`` is the
    save it was given, still whole in the staging buffer."""

    def __init__(self, job: dict[str, Any], *, died: bool = False) -> None:
        super().__init__(f"step {job['step']}")
        self.job = job
        self.died = died
