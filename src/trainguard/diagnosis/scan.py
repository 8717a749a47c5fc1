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

Here the scanner puts the parts together: ``reader`` reads the log (the only I/O), ``engines`` flag
candidate lines, ``collector`` confirms them and keeps the lines that become evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from trainguard.diagnosis.collector import (
    BLOCK_SIZE,
    MAX_LINE,
    MAX_TEXT,
    LineCollector,
    block_filler,
    clean_text,
    feed_segments,
)
from trainguard.diagnosis.engines import make_engine
from trainguard.diagnosis.reader import (
    MAX_WORKERS,
    PARALLEL_MIN_RANGE,
    LogFile,
    file_ranges,
    read_blocks,
    scan_ranges,
)
from trainguard.diagnosis.signatures import Signature

# What callers import from here, the reader's, the engines' and the collector's names among them.
__all__ = [
    "BLOCK_SIZE",
    "MAX_LINE",
    "MAX_TEXT",
    "MAX_WORKERS",
    "PARALLEL_MIN_RANGE",
    "LineMatch",
    "LogFile",
    "ScanResult",
    "Scanner",
    "clean_text",
    "read_blocks",
]

# How many occurrences of each signature are kept (the earliest ones, plus always the last one).
KEEP_FIRST = 5


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
        self._engine = make_engine(self.signatures, engine, cache_dir)
        self._keep_first = keep_first

    @property
    def engine(self) -> str:
        return self._engine.name

    def scan(self, blocks: Iterable[bytes]) -> ScanResult:
        if isinstance(blocks, LogFile):
            return self.scan_file(blocks.handle, start=blocks.start, end=blocks.end)
        collector = self._new_collector()
        size = sum(len(block) for block in blocks) if isinstance(blocks, (list, tuple)) else None
        feed_segments(block_filler(blocks), collector, size)
        return self._result(collector)

    def scan_file(
        self, handle: BinaryIO, *, start: int = 0, end: int | None = None, parts: int | None = None
    ) -> ScanResult:
        """Scans bytes [start, end) of an open file. A regular file is read by position in up to
        ``parts`` ranges cut at line ends (default: one per usable CPU up to MAX_WORKERS, each of at
        least PARALLEL_MIN_RANGE bytes), each scanned by its own process, then joined: the same
        result as reading it in one pass, in a fraction of the time. The bytes are never all in
        memory at once."""
        cuts = file_ranges(handle, start=start, end=end, parts=parts)
        if cuts is None:  # a pipe or a device: read on from where it stands
            return self.scan(read_blocks(handle))
        return self._result(scan_ranges(self._new_collector, handle.fileno(), cuts))

    def _new_collector(self, reread: Callable[[int, int], bytes] | None = None) -> LineCollector:
        return LineCollector(self.signatures, self._engine, self._keep_first, reread)

    def _result(self, collector: LineCollector) -> ScanResult:
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
