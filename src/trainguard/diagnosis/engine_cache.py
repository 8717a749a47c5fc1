"""The compiled Hyperscan databases, kept in the user's cache folder between runs.

Compiling the databases costs ~0.25 s, more than diagnosing a 512 MB log, so a compiled copy is kept:
named by the hash of the patterns, and checked against the hash of its own bytes before it is loaded.
Reading and writing this cache is the only I/O of the engines.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any


def _cache_file(cache_dir: Path, key: str) -> Path:
    return cache_dir / f"signatures-{key[:24]}.hsdb"


def load_databases(hyperscan: Any, cache_dir: Path | None, key: str) -> list[Any] | None:
    """The two databases (every match, first match) stored under ``key``; None where there is no
    cache folder, no such file, or one whose bytes do not check out."""
    if cache_dir is None:
        return None
    try:
        blob = _cache_file(cache_dir, key).read_bytes()
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


def store_databases(hyperscan: Any, cache_dir: Path | None, key: str, databases: list[Any]) -> None:
    """Keeps the two databases under ``key``, written whole or not at all (a rename)."""
    if cache_dir is None:
        return
    every, first = (hyperscan.dumpb(database) for database in databases)
    payload = len(every).to_bytes(8, "little") + every + first
    import tempfile

    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache_dir, delete=False, prefix=".tmp-") as out:
            out.write(hashlib.sha256(payload).digest() + payload)
        os.replace(out.name, _cache_file(cache_dir, key))
    except OSError:
        return  # a read-only home is no reason to fail a diagnosis
