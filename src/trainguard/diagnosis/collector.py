"""The lines kept from a scan: a log's bytes cut into segments of whole lines, the candidates an
engine flags in each confirmed by ``re``, and per signature the first few lines that match and the
last one, with their line numbers.

Which lines are kept depends on the lines only, never on where blocks or segments were cut, so the
ranges of a file scanned apart and joined (:meth:`LineCollector.add`) give the same lines as one pass.
Nothing here reads a file: the bytes come through the callables it is given.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from trainguard.diagnosis.engines import Engine
from trainguard.diagnosis.signatures import Signature

# Blocks are read into one reused buffer and stay in the CPU caches between reading, scanning and
# counting lines; 128 KiB to 2 MiB measured within noise of each other on the 512 MB benchmark log.
BLOCK_SIZE = 1024 * 1024
# A "line" longer than this (a progress bar without newlines, a binary blob) is scanned in pieces.
MAX_LINE = 2 * 1024 * 1024
# Evidence text is cut to this many characters: a person reads the start of the line.
MAX_TEXT = 400

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


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


class LineCollector:
    """The matches kept from one run of whole lines: per signature the first ``keep_first`` lines
    that match and the last one, numbered from the run's first line; and how many lines it held.

    A line is a match when Hyperscan flags it and Python's ``re`` finds the pattern in the line by
    itself. Lines are what decide, never where the segments were cut, so scanning a file in one
    range or in several gives the same matches.

    With ``reread`` (bytes [offset, offset + length) of the run, read again), a segment in which
    every signature present already has its first lines is only searched for the first match of
    each: that it holds one is noted, and the last such segment of each signature is read again at
    the end to find its last line. Without it (a stream), every segment is searched for every match."""

    def __init__(
        self,
        signatures: Sequence[Signature],
        engine: Engine,
        keep_first: int,
        reread: Callable[[int, int], bytes] | None = None,
    ) -> None:
        self._signatures = signatures
        self._engine = engine
        self._keep_first = keep_first
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


def feed_segments(fill: Callable[[memoryview], int], collector: LineCollector, size: int | None = None) -> None:
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


def block_filler(blocks: Iterable[bytes]) -> Callable[[memoryview], int]:
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
