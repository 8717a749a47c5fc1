"""The multi-pattern engines that flag candidate lines of a log: Hyperscan, which matches every
signature in one pass, and Python's ``re`` alone where Hyperscan has no wheel (correct, only slower).

An engine only nominates: every line it flags is confirmed by the signature's own ``re`` pattern.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from trainguard.diagnosis.engine_cache import load_databases, store_databases
from trainguard.diagnosis.signatures import Signature


class Engine(Protocol):
    name: str

    def find(self, segment: memoryview) -> list[tuple[int, int]]:
        """(signature index, offset inside the match) for candidate matches in ``segment``."""

    def find_first(self, segment: memoryview) -> list[tuple[int, int]]:
        """The same for the first candidate match of each signature only."""


class HyperscanEngine:
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
        databases = load_databases(hyperscan, cache_dir, key)
        if databases is None:
            databases = [self._compile(hyperscan, expressions, f) for f in (flags, first_flags)]
            store_databases(hyperscan, cache_dir, key, databases)
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


class ReEngine:
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


def make_engine(signatures: Sequence[Signature], prefer: str | None, cache_dir: Path | None) -> Engine:
    if prefer != "re":
        try:
            return HyperscanEngine(signatures, cache_dir)
        except ImportError:
            if prefer == "hyperscan":
                raise
    return ReEngine(signatures)
