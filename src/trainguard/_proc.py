"""Other processes, identified for real: a pid names a process only together with its start time
(pids are reused, within minutes on a busy machine), and a zombie is dead.

Every signal trainguard sends to a process it did not just spawn goes through here: the target is
pinned with a pidfd, its start time checked, and only then signalled, so a recorded pid that now
belongs to someone else is never hit.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses): field 3 first."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].decode("ascii", "replace").split()


def start_time(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22); None if gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def process_group(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields and len(fields) > 2 else None


@dataclass(frozen=True)
class ProcessRef:
    """One process for sure: its pid and its start time (None when it could not be read, as for a
    record written by an older trainguard: then only the pid is checked)."""

    pid: int
    start: int | None = None

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        return cls(pid, start_time(pid))

    def alive(self) -> bool:
        """Running (or stopped), not a zombie, and the same process that was recorded."""
        fields = _stat_fields(self.pid)
        if not fields or fields[0] in ("Z", "X"):
            return False
        return self.start is None or int(fields[19]) == self.start

    def signal(self, signum: int) -> bool:
        """Send ``signum`` if this is still the recorded process; whether it was sent."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except (ProcessLookupError, AttributeError, OSError):
            return False
        try:
            if not self.alive():  # checked after pinning: the pidfd cannot change hands any more
                return False
            signal.pidfd_send_signal(pidfd, signum)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(pidfd)


def pid_alive(pid: int | None) -> bool:
    """True while ``pid`` exists and is not a zombie (even owned by another user)."""
    if not pid:
        return False
    state = process_state(pid)
    if state is not None:
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def session_members(sid: int, *, not_before: int | None = None) -> list[ProcessRef]:
    """Live processes of session (or process group) ``sid`` that started at or after ``not_before``
    (ticks): both ids outlive their leader, and only processes younger than the job can be the job's."""
    members = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if not fields or len(fields) < 20 or fields[0] in ("Z", "X") or sid not in (int(fields[2]), int(fields[3])):
                continue
            started = int(fields[19])
            if not_before is None or started >= not_before:
                members.append(ProcessRef(int(entry.name), started))
    return members


def catches_signal(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for ``signum`` (/proc/PID/status SigCgt): only
    such a process can act on a signal whose default action is to terminate it (SIGUSR1)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False
