"""Streaming multi-pattern scan of a log for crash signatures.

Logs reach gigabytes, so the whole file is read in fixed-size blocks and every signature is matched
in one pass by Hyperscan (a multi-pattern DFA engine, several GB/s); only lines it flags are read
again by Python's ``re`` to confirm the match and extract named groups. Memory stays bounded by the
block size and a few kept lines per signature, whatever the file size. Where Hyperscan has no wheel
(for example macOS on ARM), the same scan runs on Python's ``re`` alone: correct, only slower.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from trainguard.diagnosis.signatures import Signature

# 1 MiB blocks stay in the CPU caches between reading, scanning and counting lines: measured 40%
# faster than 4 MiB blocks on a 256 MB log (benchmarks/bench_scan.py).
BLOCK_SIZE = 1024 * 1024
# A "line" longer than this (a progress bar without newlines, a binary blob) is scanned in pieces.
MAX_LINE = 2 * 1024 * 1024
# Evidence text is cut to this many characters: a person reads the start of the line.
MAX_TEXT = 400
# How many occurrences of each signature are kept (the earliest ones, plus always the last one).
KEEP_FIRST = 5

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

    def find(self, segment: bytes) -> list[tuple[int, int]]:
        """(signature index, offset inside the match) for candidate matches in ``segment``."""


class _HyperscanEngine:
    name = "hyperscan"

    def __init__(self, signatures: Sequence[Signature], cache_dir: Path | None = None) -> None:
        import hyperscan

        expressions = [sig.pattern.encode() for sig in signatures]
        flags = [hyperscan.HS_FLAG_MULTILINE | (hyperscan.HS_FLAG_CASELESS if sig.icase else 0) for sig in signatures]
        key = hashlib.sha256(repr((expressions, flags, getattr(hyperscan, "__version__", ""))).encode()).hexdigest()
        self._db = self._load(hyperscan, cache_dir, key)
        if self._db is None:
            self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            self._db.compile(
                expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags
            )
            self._store(hyperscan, cache_dir, key)
        self._scratch = hyperscan.Scratch(self._db)

    # Compiling the database costs ~0.12 s, a third of diagnosing a 256 MB log, so a compiled copy
    # is kept in the user's cache folder: named by the hash of the patterns, and checked against the
    # hash of its own bytes before it is loaded.
    @staticmethod
    def _cache_file(cache_dir: Path, key: str) -> Path:
        return cache_dir / f"signatures-{key[:24]}.hsdb"

    def _load(self, hyperscan: Any, cache_dir: Path | None, key: str) -> Any:
        if cache_dir is None:
            return None
        try:
            blob = self._cache_file(cache_dir, key).read_bytes()
        except OSError:
            return None
        digest, payload = blob[:32], blob[32:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        try:
            return hyperscan.loadb(payload, hyperscan.HS_MODE_BLOCK)
        except hyperscan.error:
            return None

    def _store(self, hyperscan: Any, cache_dir: Path | None, key: str) -> None:
        if cache_dir is None:
            return
        payload = hyperscan.dumpb(self._db)
        try:
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=cache_dir, delete=False, prefix=".tmp-") as out:
                out.write(hashlib.sha256(payload).digest() + payload)
            os.replace(out.name, self._cache_file(cache_dir, key))
        except OSError:
            return  # a read-only home is no reason to fail a diagnosis

    def find(self, segment: bytes) -> list[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        append = hits.append

        def on_match(sig_index: int, _start: int, end: int, _flags: int, _context: object) -> None:
            append((sig_index, end - 1))  # the match's last byte: inside the line it ends on

        self._db.scan(segment, match_event_handler=on_match, scratch=self._scratch)
        return hits


class _ReEngine:
    name = "re"
    _MAX_PER_SEGMENT = 256

    def __init__(self, signatures: Sequence[Signature]) -> None:
        self._regexes = [sig.regex for sig in signatures]

    def find(self, segment: bytes) -> list[tuple[int, int]]:
        hits = []
        for index, regex in enumerate(self._regexes):
            for count, match in enumerate(regex.finditer(segment)):
                if count >= self._MAX_PER_SEGMENT:
                    break
                hits.append((index, match.start()))
        return hits


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


def _segments(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Re-cut blocks at line ends, so that no line straddles two segments (unless it is huge)."""
    carry = b""
    for block in blocks:
        buf = carry + block if carry else block
        cut = buf.rfind(b"\n")
        if cut == -1:
            if len(buf) > MAX_LINE:
                yield buf
                carry = b""
            else:
                carry = buf
            continue
        yield buf[: cut + 1]
        carry = buf[cut + 1 :]
    if carry:
        yield carry


def clean_text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    text = text.rstrip("\r\n")
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "…"
    return text


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
        first: dict[int, list[LineMatch]] = {}
        last: dict[int, LineMatch] = {}
        lines_before = 0
        total = 0
        ends_with_newline = True
        for segment in _segments(blocks):
            total += len(segment)
            hits = self._engine.find(segment) if segment else []
            if hits:
                self._collect(segment, hits, lines_before, first, last)
            lines_before += segment.count(b"\n")
            ends_with_newline = segment.endswith(b"\n")
        lines = lines_before + (0 if ends_with_newline or total == 0 else 1)
        matches: list[LineMatch] = []
        for index in sorted(first):
            kept = first[index]
            matches.extend(kept)
            tail = last.get(index)
            if tail is not None and tail.line > kept[-1].line:
                matches.append(tail)
        matches.sort(key=lambda m: m.line)
        return ScanResult(matches=matches, lines=lines, bytes=total, engine=self._engine.name)

    def _collect(
        self,
        segment: bytes,
        hits: list[tuple[int, int]],
        lines_before: int,
        first: dict[int, list[LineMatch]],
        last: dict[int, LineMatch],
    ) -> None:
        # One candidate per (signature, line): the earliest lines while a signature still needs them,
        # and the last line of the segment for every signature that matched in it.
        wanted: dict[tuple[int, int], None] = {}
        wanted_count: dict[int, int] = {}
        last_in_segment: dict[int, int] = {}
        for sig_index, offset in hits:
            line_start = segment.rfind(b"\n", 0, offset) + 1
            previous = last_in_segment.get(sig_index)
            if previous is None or line_start > previous:
                last_in_segment[sig_index] = line_start
            key = (sig_index, line_start)
            if key not in wanted and len(first.get(sig_index, ())) + wanted_count.get(sig_index, 0) < self._keep_first:
                wanted[key] = None
                wanted_count[sig_index] = wanted_count.get(sig_index, 0) + 1
        for sig_index, line_start in last_in_segment.items():
            wanted[(sig_index, line_start)] = None

        line_no = lines_before + 1
        position = 0
        for sig_index, line_start in sorted(wanted, key=lambda key: key[1]):
            line_no += segment.count(b"\n", position, line_start)
            position = line_start
            line_end = segment.find(b"\n", line_start)
            if line_end == -1:
                line_end = len(segment)
            raw = segment[line_start:line_end]
            signature = self.signatures[sig_index]
            found = signature.regex.search(raw)
            if found is None:
                continue  # the engines disagree on this line: trust Python's re
            if b"\r" in raw[: found.start()]:
                raw = raw[raw.rfind(b"\r", 0, found.start()) + 1 :]  # what a terminal showed last
            groups = {k: v.decode("utf-8", "replace") for k, v in found.groupdict().items() if v is not None}
            match = LineMatch(signature=signature, line=line_no, text=clean_text(raw), groups=groups)
            kept = first.setdefault(sig_index, [])
            if len(kept) < self._keep_first and (not kept or kept[-1].line < line_no):
                kept.append(match)
            if line_start == last_in_segment.get(sig_index):
                last[sig_index] = match

    def scan_text(self, text: str) -> ScanResult:
        return self.scan([text.encode("utf-8", errors="surrogateescape")])
