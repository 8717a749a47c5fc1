"""Reading a log for the scanner: the diagnosis package's only I/O on logs.

A stream is read in blocks from where it stands. A regular file is read by position, in ranges that
begin at line starts, one per usable CPU, each scanned by a forked process; the ranges' kept lines are
joined with their line numbers shifted by the newlines of the ranges before.
"""

from __future__ import annotations

import itertools
import marshal
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from trainguard.diagnosis.collector import BLOCK_SIZE, MAX_LINE, LineCollector, feed_segments

# A file is scanned in several ranges at once only where each range holds at least this much: a
# worker process costs ~3 ms to start and join, a range of 8 MiB ~10 ms to scan on one core.
PARALLEL_MIN_RANGE = 8 * 1024 * 1024
# At most this many worker processes: a log is often read on a machine whose other cores feed a
# training job's data loaders, and the page cache's bandwidth is shared by all of them anyway.
MAX_WORKERS = 8


def read_blocks(stream: BinaryIO, block_size: int = BLOCK_SIZE) -> Iterator[bytes]:
    while True:
        block = stream.read(block_size)
        if not block:
            return
        yield block


class LogFile:
    """A byte range of an open regular file, to be scanned. It iterates as blocks like
    ``read_blocks`` does, but ``Scanner.scan`` reads it by position instead, in several ranges at
    once where the machine has the cores (see ``Scanner.scan_file``)."""

    def __init__(self, handle: BinaryIO, start: int = 0, end: int | None = None) -> None:
        self.handle = handle
        self.start = start
        self.end = end

    def __iter__(self) -> Iterator[bytes]:
        fd = self.handle.fileno()
        position = self.start
        end = os.fstat(fd).st_size if self.end is None else self.end
        while position < end:
            block = os.pread(fd, min(BLOCK_SIZE, end - position), position)
            if not block:
                return
            position += len(block)
            yield block


def file_ranges(handle: BinaryIO, *, start: int, end: int | None, parts: int | None) -> list[int] | None:
    """The boundaries of the ranges in which to scan bytes [start, end) of an open file (default: one
    range per usable CPU up to MAX_WORKERS, each of at least PARALLEL_MIN_RANGE bytes, and one range
    where no worker can be forked); None where it is no regular file but a pipe or a device."""
    fd = handle.fileno()
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return None
    end = info.st_size if end is None else min(end, info.st_size)
    start = min(start, end)
    if parts is None:
        parts = min(_usable_cpus(), MAX_WORKERS, (end - start) // PARALLEL_MIN_RANGE)
    return _range_cuts(fd, start, end, parts) if parts > 1 and _can_fork() else [start, end]


# Makes an empty collector; its argument reads bytes [offset, offset + length) of the range again.
NewCollector = Callable[[Callable[[int, int], bytes]], LineCollector]


def _scan_range(new_collector: NewCollector, fd: int, start: int, end: int) -> LineCollector:
    collector = new_collector(lambda offset, length: os.pread(fd, length, start + offset))
    feed_segments(_range_filler(fd, start, end), collector, end - start)
    collector.finish()
    return collector


def scan_ranges(new_collector: NewCollector, fd: int, cuts: list[int]) -> LineCollector:
    """The first range here, each further one in a forked child that sends back its kept
    matches (a few kilobytes); a range whose child cannot start or fails is scanned here."""
    first, *further = itertools.pairwise(cuts)
    workers: list[tuple[int, int] | None] = []  # (pid, pipe) per further range
    try:
        for start, end in further:
            workers.append(_fork_range(new_collector, fd, start, end))
        total = _scan_range(new_collector, fd, *first)
        for index, (start, end) in enumerate(further):
            part = _join_range(workers[index])
            workers[index] = None
            total.add(part if part is not None else _scan_range(new_collector, fd, start, end).export())
        return total
    finally:
        for worker in workers:  # interrupted: leave no child behind
            if worker is not None:
                os.kill(worker[0], signal.SIGKILL)
                _join_range(worker)


def _fork_range(new_collector: NewCollector, fd: int, start: int, end: int) -> tuple[int, int] | None:
    readable, writable = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(readable)
        os.close(writable)
        return None
    if pid == 0:  # the child: scan, report, and leave without running any of the parent's code
        status = 1
        try:
            os.close(readable)
            payload = marshal.dumps(_scan_range(new_collector, fd, start, end).export())
            with os.fdopen(writable, "wb") as out:
                out.write(payload)
            status = 0
        finally:
            os._exit(status)
    os.close(writable)
    return pid, readable


def _join_range(worker: tuple[int, int] | None) -> Any:
    """The child's kept matches, or None where it could not give them."""
    if worker is None:
        return None
    pid, readable = worker
    with os.fdopen(readable, "rb") as report:
        payload = report.read()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return None
    try:
        return marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None


def _range_filler(fd: int, start: int, end: int) -> Callable[[memoryview], int]:
    position = start

    def fill(into: memoryview) -> int:
        nonlocal position
        want = min(len(into), end - position)
        if want <= 0:
            return 0
        count = os.preadv(fd, [into[:want]], position) if _HAS_PREADV else _pread_into(fd, into[:want], position)
        position += count
        return count

    return fill


_HAS_PREADV = hasattr(os, "preadv")


def _pread_into(fd: int, into: memoryview, position: int) -> int:
    data = os.pread(fd, len(into), position)
    into[: len(data)] = data
    return len(data)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _range_cuts(fd: int, start: int, end: int, parts: int) -> list[int]:
    """Boundaries that split [start, end) into up to ``parts`` ranges of about equal size, each
    boundary just after a newline, so that every range begins at the start of a line."""
    cuts = [start]
    for index in range(1, parts):
        position = max(start + (end - start) * index // parts, cuts[-1])
        limit = min(end, position + 2 * MAX_LINE)  # no newline that far: no cut here
        while position < limit:
            chunk = os.pread(fd, min(64 * 1024, limit - position), position)
            if not chunk:
                break
            newline = chunk.find(b"\n")
            if newline != -1:
                if position + newline + 1 < end:
                    cuts.append(position + newline + 1)
                break
            position += len(chunk)
    cuts.append(end)
    return cuts


def _can_fork() -> bool:
    """Whether a worker can be forked without exec: never beside other threads (one of them may hold
    a lock the child would wait on forever), and not on macOS, whose system libraries start threads
    Python does not see."""
    if not hasattr(os, "fork") or sys.platform == "darwin":
        return False
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1
