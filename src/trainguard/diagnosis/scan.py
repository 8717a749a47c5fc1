"""Streaming multi-pattern scan of a log for crash signatures.

Logs reach gigabytes, so the whole file is read in fixed-size blocks, re-cut at line ends, and every
signature is matched in one pass by Hyperscan (a multi-pattern DFA engine); only lines it flags are
read again by Python's ``re`` to confirm the match and extract named groups. Memory stays bounded by
the block size and a few kept lines per signature, whatever the file size. Where Hyperscan has no
wheel (for example macOS on ARM), the same scan runs on Python's ``re`` alone: correct, only slower.

A regular file is split into ranges that begin at line starts, one per usable CPU, each scanned by a
forked process; the ranges' kept lines are joined with their line numbers shifted by the newlines of
the ranges before. Which lines are kept depends on the lines only, never on where blocks or ranges
were cut, so a file gives the same matches as the same bytes streamed through one process.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import marshal
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from trainguard.diagnosis.signatures import Signature

# Blocks are read into one reused buffer and stay in the CPU caches between reading, scanning and
# counting lines; 128 KiB to 2 MiB measured within noise of each other on the 512 MB benchmark log.
BLOCK_SIZE = 1024 * 1024
# A "line" longer than this (a progress bar without newlines, a binary blob) is scanned in pieces.
MAX_LINE = 2 * 1024 * 1024
# Evidence text is cut to this many characters: a person reads the start of the line.
MAX_TEXT = 400
# How many occurrences of each signature are kept (the earliest ones, plus always the last one).
KEEP_FIRST = 5
# A file is scanned in several ranges at once only where each range holds at least this much: a
# worker process costs ~3 ms to start and join, a range of 8 MiB ~10 ms to scan on one core.
PARALLEL_MIN_RANGE = 8 * 1024 * 1024
# At most this many worker processes: a log is often read on a machine whose other cores feed a
# training job's data loaders, and the page cache's bandwidth is shared by all of them anyway.
MAX_WORKERS = 8

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class LineMatch:
    signature: Signature
    line: int  # 1-based line number in the scanned text
    text: str
    groups: dict[str, str] = field(default_factory=dict)


@dataclass
class ScanResult:
    matches: list[LineMatch]
    lines: int
    bytes: int
    engine: str


class _Engine(Protocol):
    name: str

    def find(self, segment: memoryview) -> list[tuple[int, int]]:
        """(signature index, offset inside the match) for candidate matches in ``segment``."""

    def find_first(self, segment: memoryview) -> list[tuple[int, int]]:
        """The same for the first candidate match of each signature only."""


class _HyperscanEngine:
    name = "hyperscan"

    def __init__(self, signatures: Sequence[Signature], cache_dir: Path | None = None) -> None:
        import hyperscan

        expressions = [sig.pattern.encode() for sig in signatures]
        flags = [hyperscan.HS_FLAG_MULTILINE | (hyperscan.HS_FLAG_CASELESS if sig.icase else 0) for sig in signatures]
        # The patterns twice: one database reports every match, the other only the first match of
        # each pattern (HS_FLAG_SINGLEMATCH), so that a block with thousands of lines of a signature
        # already seen costs one Python call for it, not thousands.
        first_flags = [flag | hyperscan.HS_FLAG_SINGLEMATCH for flag in flags]
        key = hashlib.sha256(
            repr((expressions, flags, first_flags, getattr(hyperscan, "__version__", ""))).encode()
        ).hexdigest()
        databases = self._load(hyperscan, cache_dir, key)
        if databases is None:
            databases = [self._compile(hyperscan, expressions, f) for f in (flags, first_flags)]
            self._store(hyperscan, cache_dir, key, databases)
        self._every, self._first = databases
        self._every_scratch = hyperscan.Scratch(self._every)
        self._first_scratch = hyperscan.Scratch(self._first)

    @staticmethod
    def _compile(hyperscan: Any, expressions: list[bytes], flags: list[int]) -> Any:
        database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        database.compile(
            expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags
        )
        return database

    # Compiling the databases costs ~0.25 s, more than diagnosing a 512 MB log, so a compiled copy
    # is kept in the user's cache folder: named by the hash of the patterns, and checked against the
    # hash of its own bytes before it is loaded.
    @staticmethod
    def _cache_file(cache_dir: Path, key: str) -> Path:
        return cache_dir / f"signatures-{key[:24]}.hsdb"

    def _load(self, hyperscan: Any, cache_dir: Path | None, key: str) -> list[Any] | None:
        if cache_dir is None:
            return None
        try:
            blob = self._cache_file(cache_dir, key).read_bytes()
        except OSError:
            return None
        digest, payload = blob[:32], blob[32:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        split = 8 + int.from_bytes(payload[:8], "little")
        try:
            return [hyperscan.loadb(part, hyperscan.HS_MODE_BLOCK) for part in (payload[8:split], payload[split:])]
        except hyperscan.error:
            return None

    def _store(self, hyperscan: Any, cache_dir: Path | None, key: str, databases: list[Any]) -> None:
        if cache_dir is None:
            return
        every, first = (hyperscan.dumpb(database) for database in databases)
        payload = len(every).to_bytes(8, "little") + every + first
        import tempfile

        try:
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=cache_dir, delete=False, prefix=".tmp-") as out:
                out.write(hashlib.sha256(payload).digest() + payload)
            os.replace(out.name, self._cache_file(cache_dir, key))
        except OSError:
            return  # a read-only home is no reason to fail a diagnosis

    def find(self, segment: memoryview) -> list[tuple[int, int]]:
        return self._scan(self._every, self._every_scratch, segment)

    def find_first(self, segment: memoryview) -> list[tuple[int, int]]:
        return self._scan(self._first, self._first_scratch, segment)

    @staticmethod
    def _scan(database: Any, scratch: Any, segment: memoryview) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(sig_index: int, _start: int, end: int, _flags: int, _context: object) -> None:
            append((sig_index, end - 1))  # the match's last byte: inside the line it ends on

        database.scan(segment, match_event_handler=on_match, scratch=scratch)
        return hits


class _ReEngine:
    name = "re"
    _MAX_PER_SEGMENT = 256

    def __init__(self, signatures: Sequence[Signature]) -> None:
        self._regexes = [sig.regex for sig in signatures]

    def find(self, segment: memoryview) -> list[tuple[int, int]]:
        hits = []
        for index, regex in enumerate(self._regexes):
            for count, match in enumerate(regex.finditer(segment)):
                if count >= self._MAX_PER_SEGMENT:
                    break
                hits.append((index, match.start()))
        return hits

    def find_first(self, segment: memoryview) -> list[tuple[int, int]]:
        return [(index, found.start()) for index, regex in enumerate(self._regexes) if (found := regex.search(segment))]


def _make_engine(signatures: Sequence[Signature], prefer: str | None, cache_dir: Path | None) -> _Engine:
    if prefer != "re":
        try:
            return _HyperscanEngine(signatures, cache_dir)
        except ImportError:
            if prefer == "hyperscan":
                raise
    return _ReEngine(signatures)


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


def clean_text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    text = text.rstrip("\r\n")
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "…"
    return text


# (line number, text, groups) of a kept match, as a worker process sends it back.
_Kept = tuple[int, str, dict[str, str]]


class _Collector:
    """The matches kept from one run of whole lines: per signature the first ``keep_first`` lines
    that match and the last one, numbered from the run's first line; and how many lines it held.

    A line is a match when Hyperscan flags it and Python's ``re`` finds the pattern in the line by
    itself. Lines are what decide, never where the segments were cut, so scanning a file in one
    range or in several gives the same matches.

    With ``reread`` (bytes [offset, offset + length) of the run, read again), a segment in which
    every signature present already has its first lines is only searched for the first match of
    each: that it holds one is noted, and the last such segment of each signature is read again at
    the end to find its last line. Without it (a stream), every segment is searched for every match."""

    def __init__(self, scanner: Scanner, reread: Callable[[int, int], bytes] | None = None) -> None:
        self._signatures = scanner.signatures
        self._engine = scanner._engine
        self._keep_first = scanner._keep_first
        self._reread = reread
        self.first: dict[int, list[_Kept]] = {}
        self.last: dict[int, _Kept] = {}
        # signature -> (offset, length, newlines before) of the latest segment that holds a
        # confirmed match of it, where that segment was not searched for every match
        self._last_segment: dict[int, tuple[int, int, int]] = {}
        self.newlines = 0
        self.size = 0
        self.ends_with_newline = True

    def segment(self, data: bytes | bytearray, length: int) -> None:
        """Scans ``data[:length]``: whole lines, or a piece of a line longer than MAX_LINE."""
        offset = self.size
        self.size += length
        continues_line = not self.ends_with_newline  # the previous segment was a piece of this line
        self.ends_with_newline = data[length - 1] == 0x0A
        view = memoryview(data)[:length]
        if self._reread is not None:
            firsts = self._engine.find_first(view)
            if not firsts or self._note_segment(data, length, firsts, offset):
                self.newlines += data.count(b"\n", 0, length)
                return
        hits = self._engine.find(view)
        if not hits:
            self.newlines += data.count(b"\n", 0, length)
            return
        hits.sort()
        confirmed = self._confirm(data, length, hits, continues_line)
        # Line numbers only for the confirmed lines, counting newlines once across the segment.
        position = 0
        line_no = self.newlines + 1
        for line_start, sig_index, kind, line, found in sorted(confirmed, key=lambda item: (item[0], item[1])):
            line_no += data.count(b"\n", position, line_start)
            position = line_start
            kept_match = _kept(line_no, line, found)
            if kind & _FIRST:
                kept = self.first.setdefault(sig_index, [])
                if not kept or kept[-1][0] < line_no:
                    kept.append(kept_match)
            if kind & _LAST:
                self.last[sig_index] = kept_match
                self._last_segment.pop(sig_index, None)
        self.newlines = line_no - 1 + data.count(b"\n", position, length)

    def _note_segment(self, data: bytes | bytearray, length: int, firsts: list[tuple[int, int]], offset: int) -> bool:
        """Where every signature found in this segment has its first lines, and the line of its
        first hit here is confirmed, notes the segment as the latest to hold each. False where the
        segment must be searched for every match instead."""
        for sig_index, hit in firsts:
            if len(self.first.get(sig_index, ())) < self._keep_first:
                return False
            line_start = data.rfind(b"\n", 0, hit) + 1
            line_end = data.find(b"\n", line_start, length)
            line = bytes(data[line_start : line_end if line_end != -1 else length])
            if self._signatures[sig_index].regex.search(line) is None:
                return False  # a hit re does not confirm: the other hits here decide
        for sig_index, _hit in firsts:
            self._last_segment[sig_index] = (offset, length, self.newlines)
        return True

    def finish(self) -> None:
        """Finds the last line of each signature in the segment noted as its latest."""
        by_segment: dict[tuple[int, int, int], list[int]] = {}
        for sig_index, where in self._last_segment.items():
            by_segment.setdefault(where, []).append(sig_index)
        self._last_segment = {}
        for (offset, length, newlines), signatures in by_segment.items():
            assert self._reread is not None
            data = self._reread(offset, length)
            hits = sorted(self._engine.find(memoryview(data)))
            for sig_index in signatures:
                begin = bisect.bisect_left(hits, (sig_index, -1))
                end = bisect.bisect_left(hits, (sig_index + 1, -1))
                previous = -1
                for _sig, hit in reversed(hits[begin:end]):
                    line_start = data.rfind(b"\n", 0, hit) + 1
                    if line_start == previous:
                        continue
                    previous = line_start
                    line_end = data.find(b"\n", line_start)
                    line = data[line_start : line_end if line_end != -1 else length]
                    found = self._signatures[sig_index].regex.search(line)
                    if found is not None:
                        line_no = newlines + 1 + data.count(b"\n", 0, line_start)
                        self.last[sig_index] = _kept(line_no, line, found)
                        break

    def _confirm(
        self, data: bytes | bytearray, length: int, hits: list[tuple[int, int]], continues_line: bool
    ) -> list[tuple[int, int, int, bytes, re.Match[bytes]]]:
        """The lines to keep from this segment, each confirmed by ``re``: (line start, signature,
        first and/or last, the line, the match). ``hits`` is sorted by signature, then offset."""
        confirmed: dict[tuple[int, int], list[Any]] = {}
        lines_seen: dict[int, bytes] = {}

        def check(sig_index: int, line_start: int, kind: int) -> bool:
            key = (line_start, sig_index)
            if key in confirmed:
                confirmed[key][2] |= kind
                return True
            line = lines_seen.get(line_start)
            if line is None:
                line_end = data.find(b"\n", line_start, length)
                line = lines_seen[line_start] = bytes(data[line_start : line_end if line_end != -1 else length])
            found = self._signatures[sig_index].regex.search(line)
            if found is None:
                return False  # the engines disagree on this line (a match across lines): trust re
            confirmed[key] = [line_start, sig_index, kind, line, found]
            return True

        for sig_index in dict(hits):  # each signature once, in order
            begin = bisect.bisect_left(hits, (sig_index, -1))
            end = bisect.bisect_left(hits, (sig_index + 1, -1))
            # The earliest lines, while the signature still needs them.
            kept = self.first.get(sig_index, ())
            wanted = self._keep_first - len(kept)
            previous = -1
            for index in range(begin, end if wanted > 0 else begin):
                line_start = data.rfind(b"\n", 0, hits[index][1]) + 1
                if line_start == previous:
                    continue
                previous = line_start
                if line_start == 0 and continues_line and kept and kept[-1][0] == self.newlines + 1:
                    continue  # this line's earlier piece is already kept
                if check(sig_index, line_start, _FIRST):
                    wanted -= 1
                    if wanted == 0:
                        break
            # The last line of the segment that matches: almost always the line of the last hit.
            previous = -1
            for index in range(end - 1, begin - 1, -1):
                line_start = data.rfind(b"\n", 0, hits[index][1]) + 1
                if line_start != previous:
                    previous = line_start
                    if check(sig_index, line_start, _LAST):
                        break
        return [tuple(item) for item in confirmed.values()]  # type: ignore[misc]

    def export(self) -> tuple[int, int, bool, dict[int, list[_Kept]], dict[int, _Kept]]:
        self.finish()
        return self.newlines, self.size, self.ends_with_newline, self.first, self.last

    def add(self, part: tuple[int, int, bool, dict[int, list[_Kept]], dict[int, _Kept]]) -> None:
        """Appends the run of lines that follows this one (it starts at a line start)."""
        self.finish()
        newlines, size, ends_with_newline, first, last = part
        for sig_index, kept in first.items():
            mine = self.first.setdefault(sig_index, [])
            room = self._keep_first - len(mine)
            mine.extend((line + self.newlines, text, groups) for line, text, groups in kept[: max(room, 0)])
        for sig_index, (line, text, groups) in last.items():
            self.last[sig_index] = (line + self.newlines, text, groups)
        self.newlines += newlines
        self.size += size
        self.ends_with_newline = ends_with_newline if size else self.ends_with_newline


_FIRST, _LAST = 1, 2


def _kept(line_no: int, line: bytes, found: re.Match[bytes]) -> _Kept:
    if b"\r" in line[: found.start()]:
        line = line[line.rfind(b"\r", 0, found.start()) + 1 :]  # what a terminal showed last
    groups = {k: v.decode("utf-8", "replace") for k, v in found.groupdict().items() if v is not None}
    return line_no, clean_text(line), groups


def _feed_segments(fill: Callable[[memoryview], int], collector: _Collector, size: int | None = None) -> None:
    """Reads through ``fill`` (which writes into the view it gets and returns how many bytes, 0 at
    the end) and hands ``collector`` whole lines; a line longer than MAX_LINE goes in pieces of
    MAX_LINE bytes counted from the line's start, so the pieces do not depend on where reading began.
    ``size``: how many bytes will come, where known (a small input gets a small buffer)."""
    buffer = bytearray(MAX_LINE + BLOCK_SIZE if size is None else min(MAX_LINE + BLOCK_SIZE, size + 1))
    view = memoryview(buffer)
    filled = 0
    exhausted = False
    while not exhausted or filled:
        if not exhausted:
            count = fill(view[filled : filled + BLOCK_SIZE])
            exhausted = count == 0
            filled += count
        while filled:
            if buffer.find(b"\n", 0, min(filled, MAX_LINE)) == -1:
                if filled >= MAX_LINE:
                    cut = MAX_LINE  # a piece of a huge line
                elif exhausted:
                    cut = filled  # the last line, without its newline
                else:
                    break  # the line goes on in the next block
            else:
                cut = buffer.rfind(b"\n", 0, filled) + 1
            collector.segment(buffer, cut)
            view[: filled - cut] = view[cut:filled]
            filled -= cut
            if not exhausted:
                break  # what is left has no newline, unless a piece was cut: read on first
    view.release()


def _block_filler(blocks: Iterable[bytes]) -> Callable[[memoryview], int]:
    source = iter(blocks)
    pending = memoryview(b"")

    def fill(into: memoryview) -> int:
        nonlocal pending
        done = 0
        while done < len(into):
            if not pending:
                block = next(source, None)
                if block is None:
                    break
                pending = memoryview(block).cast("B")
                continue
            take = min(len(pending), len(into) - done)
            into[done : done + take] = pending[:take]
            pending = pending[take:]
            done += take
        return done

    return fill


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


class Scanner:
    """Finds signature lines in a stream of bytes. One instance compiles its patterns once."""

    def __init__(
        self,
        signatures: Sequence[Signature],
        *,
        engine: str | None = None,
        keep_first: int = KEEP_FIRST,
        cache_dir: Path | None = None,
    ) -> None:
        self.signatures = tuple(signatures)
        self._engine = _make_engine(self.signatures, engine, cache_dir)
        self._keep_first = keep_first

    @property
    def engine(self) -> str:
        return self._engine.name

    def scan(self, blocks: Iterable[bytes]) -> ScanResult:
        if isinstance(blocks, LogFile):
            return self.scan_file(blocks.handle, start=blocks.start, end=blocks.end)
        collector = _Collector(self)
        size = sum(len(block) for block in blocks) if isinstance(blocks, (list, tuple)) else None
        _feed_segments(_block_filler(blocks), collector, size)
        return self._result(collector)

    def scan_file(
        self, handle: BinaryIO, *, start: int = 0, end: int | None = None, parts: int | None = None
    ) -> ScanResult:
        """Scans bytes [start, end) of an open file. A regular file is read by position in up to
        ``parts`` ranges cut at line ends (default: one per usable CPU up to MAX_WORKERS, each of at
        least PARALLEL_MIN_RANGE bytes), each scanned by its own process, then joined: the same
        result as reading it in one pass, in a fraction of the time. The bytes are never all in
        memory at once."""
        fd = handle.fileno()
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a pipe or a device: read on from where it stands
            return self.scan(read_blocks(handle))
        end = info.st_size if end is None else min(end, info.st_size)
        start = min(start, end)
        if parts is None:
            parts = min(_usable_cpus(), MAX_WORKERS, (end - start) // PARALLEL_MIN_RANGE)
        cuts = _range_cuts(fd, start, end, parts) if parts > 1 and _can_fork() else [start, end]
        return self._result(self._scan_ranges(fd, cuts))

    def _scan_range(self, fd: int, start: int, end: int) -> _Collector:
        collector = _Collector(self, reread=lambda offset, length: os.pread(fd, length, start + offset))
        _feed_segments(_range_filler(fd, start, end), collector, end - start)
        collector.finish()
        return collector

    def _scan_ranges(self, fd: int, cuts: list[int]) -> _Collector:
        """The first range here, each further one in a forked child that sends back its kept
        matches (a few kilobytes); a range whose child cannot start or fails is scanned here."""
        first, *further = itertools.pairwise(cuts)
        workers: list[tuple[int, int] | None] = []  # (pid, pipe) per further range
        try:
            for start, end in further:
                workers.append(self._fork_range(fd, start, end))
            total = self._scan_range(fd, *first)
            for index, (start, end) in enumerate(further):
                part = self._join_range(workers[index])
                workers[index] = None
                total.add(part if part is not None else self._scan_range(fd, start, end).export())
            return total
        finally:
            for worker in workers:  # interrupted: leave no child behind
                if worker is not None:
                    os.kill(worker[0], signal.SIGKILL)
                    self._join_range(worker)

    def _fork_range(self, fd: int, start: int, end: int) -> tuple[int, int] | None:
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
                payload = marshal.dumps(self._scan_range(fd, start, end).export())
                with os.fdopen(writable, "wb") as out:
                    out.write(payload)
                status = 0
            finally:
                os._exit(status)
        os.close(writable)
        return pid, readable

    @staticmethod
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

    def _result(self, collector: _Collector) -> ScanResult:
        matches: list[LineMatch] = []
        for sig_index in sorted(collector.first):
            signature = self.signatures[sig_index]
            kept = collector.first[sig_index]
            tail = collector.last.get(sig_index)
            if tail is not None and tail[0] > kept[-1][0]:
                kept = [*kept, tail]
            matches.extend(
                LineMatch(signature=signature, line=line, text=text, groups=groups) for line, text, groups in kept
            )
        matches.sort(key=lambda m: m.line)
        lines = collector.newlines + (0 if collector.ends_with_newline or collector.size == 0 else 1)
        return ScanResult(matches=matches, lines=lines, bytes=collector.size, engine=self._engine.name)

    def scan_text(self, text: str) -> ScanResult:
        return self.scan([text.encode("utf-8", errors="surrogateescape")])
