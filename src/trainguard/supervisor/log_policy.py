"""How much of a job's output is kept, as a pure function of sizes: when an attempt's log is rotated
and what of it survives, how much room the state disk must keep free, and what is cut from the logs
of a run's ended attempts. The files themselves are ``log_rotation``'s.

The model is supervisord's (``stdout_logfile_maxbytes`` / ``_backups``) and Docker's (``max-size`` /
``max-file``), plus what diagnosis needs: an attempt keeps its first part (the head, saved once: the
command line, the versions, the first error of a job that never got going) and its newest part (the
live log and up to ``backups`` earlier pieces of it, contiguous, each at most ``max_size``). What lies
between is dropped, and its size counted, so `trainguard logs` can say how much is missing where.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KiB = 1 << 10
MiB = 1 << 20

DEFAULT_MAX_SIZE = 50 * MiB  # supervisord's stdout_logfile_maxbytes
DEFAULT_BACKUPS = 3  # supervisord keeps 10 and Docker's local driver 5; a state folder in a home quota keeps fewer
MIN_MAX_SIZE = 1 * MiB
HEAD_BYTES = 1 * MiB  # the attempt's first part, kept for good
MIN_NEWEST = 1 * MiB  # under disk pressure the newest part shrinks to this, never to nothing
OLD_HEAD_BYTES = 64 * KiB  # an ended attempt, cut down: its first lines ...
OLD_TAIL_BYTES = 256 * KiB  # ... and its last ones (where its death is)
WORTH_ROTATING = 64 * KiB  # freeing less than this is not worth a rotation under pressure
LOW_WATER_FRACTION = 0.05  # of the state disk, kept free for the registry and the supervisor's records
LOW_WATER_MIN = 1 * MiB
LOW_WATER_MAX = 1 << 30
POLL_S = 1.0  # the supervisor's tick
MIN_POLL_S = 0.05  # a writer faster than max_size in this long overshoots by at most what it writes in it
TICKS_OF_HEADROOM = 2  # the free room also covers this many ticks of the log's growth


@dataclass(frozen=True)
class LogBound:
    """One run's log settings (``run --log-max-size``, ``--log-backups``)."""

    max_size: int = DEFAULT_MAX_SIZE
    backups: int = DEFAULT_BACKUPS

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> LogBound:
        return cls(int(options.get("log_max_size") or DEFAULT_MAX_SIZE),
                   int(options.get("log_backups", DEFAULT_BACKUPS)))  # fmt: skip

    @property
    def head_bytes(self) -> int:
        return min(HEAD_BYTES, self.max_size)

    @property
    def attempt_bytes(self) -> int:
        """The most one attempt's log holds (plus what the job writes in a tick, for each file)."""
        return self.head_bytes + (self.backups + 1) * self.max_size

    @property
    def old_attempts_bytes(self) -> int:
        """The most the logs of a run's ended attempts hold together."""
        return (self.backups + 1) * self.max_size


@dataclass(frozen=True)
class LiveLog:
    """The running attempt's log as it stands: its live file's size, the backups kept (sizes, the
    newest first), whether its head is saved yet, and how fast it grows (bytes per tick)."""

    size: int
    backups: tuple[int, ...] = ()
    head_saved: bool = False
    growth: int = 0


@dataclass(frozen=True)
class Disk:
    """The state folder's filesystem."""

    total: int
    free: int


@dataclass(frozen=True)
class Rotation:
    """One rotation of the live log. ``save_head``: bytes of the live file's start copied to the head
    file first (0 once it is saved); ``to_backup``: the live file's newest bytes copied to backup 1
    before the live file is emptied (the rest is dropped; None: all of it but the head);
    ``keep_backups``: how many of the older backups survive, the newest of them (the others are
    dropped); ``pressure``: done to make room."""

    save_head: int
    to_backup: int | None
    keep_backups: int
    pressure: bool


def low_water(disk_total: int) -> int:
    """Room on the state disk that the run's logs never take: the registry and the supervisor's own
    records (its marker lines, the end of the run) need it."""
    return int(min(LOW_WATER_MAX, max(LOW_WATER_MIN, disk_total * LOW_WATER_FRACTION)))


def poll_in(size: int, growth_per_s: float, bound: LogBound) -> float:
    """Seconds until the live log should be looked at again: a second, or sooner where at its rate
    it reaches its size before then (never more often than MIN_POLL_S)."""
    if growth_per_s <= 0:
        return POLL_S
    return min(POLL_S, max(MIN_POLL_S, (bound.max_size - size) / growth_per_s))


def room_needed(disk: Disk, growth: int) -> int:
    """Bytes to free on the state disk now (0: none): its low water plus a few ticks of the log."""
    return max(0, low_water(disk.total) + TICKS_OF_HEADROOM * max(0, growth) - disk.free)


def plan_rotation(log: LiveLog, bound: LogBound, disk: Disk) -> Rotation | None:
    """What to do with the live log this tick: nothing, a rotation because it reached its size, or a
    rotation that makes room on a state disk nearly full (early, and keeping less)."""
    need = room_needed(disk, log.growth)
    if need == 0 and log.size < bound.max_size:
        return None
    save_head = 0 if log.head_saved else min(log.size, bound.head_bytes)
    content = log.size - save_head  # what the live file holds besides its head
    if need == 0:
        if not bound.backups:
            return Rotation(save_head, 0, 0, pressure=False)
        if content <= 2 * bound.max_size:  # all of it: a little over the size, next to the older backups
            return Rotation(save_head, None, bound.backups - 1, pressure=False)
        # A writer faster than the polling (`yes`): only the newest max_size survives, and the older
        # backups, no longer next to it, go too.
        return Rotation(save_head, bound.max_size, 0, pressure=False)
    before = log.size + sum(log.backups)

    def freed(to_backup: int, keep: int) -> int:
        return before - (save_head + to_backup + sum(log.backups[:keep]))

    full_backup = content if bound.backups else 0
    for keep in range(max(0, bound.backups - 1), -1, -1):  # drop the oldest backups first
        if freed(full_backup, keep) >= need:
            return Rotation(save_head, None if bound.backups else 0, keep, pressure=True)
    small_backup = min(full_backup, MIN_NEWEST)
    if freed(small_backup, 0) < WORTH_ROTATING:
        return None  # the room is taken by something else: rotating this log would not give it back
    return Rotation(save_head, small_backup, 0, pressure=True)


@dataclass(frozen=True)
class EndedLog:
    """What an ended attempt's log holds on disk: its head file, its backups together, its live file;
    ``trimmed``: already cut down to its first and last lines."""

    n: int
    head: int
    backups: int
    live: int
    trimmed: bool = False

    @property
    def total(self) -> int:
        return self.head + self.backups + self.live

    @property
    def trimmed_total(self) -> int:
        """Its size once cut down: the first lines (from its head file, or its live file's start if it
        never rotated) and the last ones."""
        return min(self.head or self.live, OLD_HEAD_BYTES) + min(self.backups + self.live, OLD_TAIL_BYTES)


def plan_old_attempts(logs: Sequence[EndedLog], budget: int, *, may_remove: bool = True) -> list[tuple[int, str]]:
    """What is cut from the ended attempts' logs (``logs`` the oldest first) to keep them within
    ``budget`` bytes together: the oldest are cut down to their first and last lines first
    (``"trim"``), then, where that is not enough, removed (``"remove"``), the oldest first."""
    total = sum(log.total for log in logs)
    actions: list[tuple[int, str]] = []
    sizes = {log.n: log.total for log in logs}
    for log in logs:
        if total <= budget:
            return actions
        if not log.trimmed and log.trimmed_total < log.total:
            actions.append((log.n, "trim"))
            total -= log.total - log.trimmed_total
            sizes[log.n] = log.trimmed_total
    if not may_remove:
        return actions
    for log in logs:
        if total <= budget:
            break
        actions = [(n, what) for n, what in actions if n != log.n] + [(log.n, "remove")]
        total -= sizes[log.n]
    return actions
