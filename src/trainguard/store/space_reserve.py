"""Room held back on the state disk for the records that say how a run ended.

A supervisor keeps a file of allocated blocks, ``reserve``, in the state folder. When the disk is
full and a record that matters cannot be written (an attempt's end, a change of the run's state, a
person's stop request), the file is removed and the write tried again in the room it gave back; it is
made again once the disk has room. Without it a job that filled the state disk left its run
"running" until someone made room: the supervisor had nowhere to write the end.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

RESERVE_NAME = "reserve"
RESERVE_FRACTION = 32  # of the state disk ...
RESERVE_MAX = 8 << 20  # ... and at most this
SMALLEST_DISK = 32 << 20  # a disk smaller than this holds only a small reserve ...
SMALL_RESERVE = 256 << 10  # ... this much (and at most 1/32 of it): enough for the records of a run's end
FREE_TO_MAKE_IT = 4  # made again only when the disk has this many times its size free
MAKE_EVERY_S = 30.0


def reserve_size(disk_total: int) -> int:
    """How much room is held back on a disk of ``disk_total`` bytes (0: none)."""
    if disk_total < SMALLEST_DISK:
        return min(SMALL_RESERVE, disk_total // RESERVE_FRACTION)
    return min(RESERVE_MAX, disk_total // RESERVE_FRACTION)


class SpaceReserve:
    def __init__(self, state_dir: Path, *, clock=time.monotonic) -> None:
        self.path = Path(state_dir) / RESERVE_NAME
        self.clock = clock
        self._next_try = 0.0

    def keep(self) -> None:
        """Make the reserve if it is missing and the disk has plenty of room (tried at most every
        30 s). Never fails: without a reserve the records wait for room as before."""
        now = self.clock()
        if now < self._next_try:
            return
        self._next_try = now + MAKE_EVERY_S
        with contextlib.suppress(OSError):
            disk = os.statvfs(self.path.parent)
            wanted = reserve_size(disk.f_blocks * disk.f_frsize)
            if wanted == 0 or self._held() >= wanted or disk.f_bavail * disk.f_frsize < FREE_TO_MAKE_IT * wanted:
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, wanted)  # real blocks: a sparse file would hold nothing back
            except OSError:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)

    def _held(self) -> int:
        try:
            info = self.path.lstat()
        except OSError:
            return 0
        return info.st_blocks * 512

    def spend(self) -> int:
        """Give the room back to the disk; the bytes it held (0: there was none)."""
        held = self._held()
        if held == 0:
            return 0
        try:
            self.path.unlink()
        except OSError:
            return 0
        self._next_try = self.clock() + MAKE_EVERY_S
        return held
