"""Reading a checkpoint back, every byte checked against its manifest: the manifest itself, a file
whole (``read_verified``) or straight into the caller's buffers (``read_into``), the cheap check of
sizes alone that pruning uses, and which folders hold a manifest at all.

A manifest (and a job's ``job.json``) is read like anything another process wrote: bounded in size,
never followed into a FIFO or a device, and whatever does not parse (nested past the parser's depth
too) makes the checkpoint damaged, never the reader fail."""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainguard import _untrusted as untrusted
from trainguard.checkpoint._format import (
    CHUNK,
    FORMAT_VERSION,
    MANIFEST_FILE,
    SHARD_NAME,
    DamagedCheckpoint,
    Manifest,
    step_of,
)

MAX_JSON_BYTES = 8 * 1024 * 1024  # a job.json of 10,000 ranks is ~2 MB; a manifest a few hundred bytes


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of a file of the checkpoint; DamagedCheckpoint for anything else."""
    handle = untrusted.open_regular(str(path))
    if handle is None:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        raise DamagedCheckpoint(f"{path.parent.name}/{path.name} is not a regular file")
    with handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise DamagedCheckpoint(f"{path.parent.name}/{path.name} is larger than {limit} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise DamagedCheckpoint(f"{path.parent.name}/{path.name}: not readable JSON ({type(exc).__name__})") from exc


def read_manifest(path: Path) -> Manifest:
    try:
        raw = read_json(path / MANIFEST_FILE)
        manifest = Manifest(
            step=int(raw["step"]),
            time=float(raw["time"]),
            files=dict(raw["files"]),
            format=int(raw["format"]),
            rank=None if raw.get("rank") is None else int(raw["rank"]),
            world_size=None if raw.get("world_size") is None else int(raw["world_size"]),
        )
    except FileNotFoundError as exc:
        raise DamagedCheckpoint(f"{path.name}: no manifest (the save did not finish)") from exc
    except DamagedCheckpoint:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise DamagedCheckpoint(f"{path.name}: unreadable manifest ({exc})") from exc
    if not all(isinstance(entry, dict) and all(untrusted.is_int(entry.get(key)) for key in ("size", "crc32"))
               for entry in manifest.files.values()):  # fmt: skip
        raise DamagedCheckpoint(f"{path.name}: unreadable manifest (a file without its size and checksum)")
    if manifest.format > FORMAT_VERSION:
        raise DamagedCheckpoint(f"{path.name}: written by a newer trainguard (format {manifest.format})")
    expected = step_of(path) if SHARD_NAME.match(path.name) is None else step_of(path.parent)
    if manifest.step != expected:
        raise DamagedCheckpoint(f"{path.name}: manifest says step {manifest.step}")
    return manifest


def read_verified(path: Path, name: str, manifest: Manifest) -> bytearray:
    """A file's bytes, checked against the manifest's size and CRC-32."""
    expected = manifest.files.get(name)
    if expected is None:
        raise DamagedCheckpoint(f"{path.name}: manifest lists no {name}")
    try:
        with open(path / name, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != expected["size"]:
                raise DamagedCheckpoint(f"{path.name}/{name}: {size} bytes, manifest says {expected['size']}")
            data = bytearray(size)
            view = memoryview(data)
            read = 0
            while read < size:
                got = handle.readinto(view[read : read + CHUNK])
                if not got:
                    raise DamagedCheckpoint(f"{path.name}/{name}: shorter than its size")
                read += got
    except OSError as exc:
        raise DamagedCheckpoint(f"{path.name}/{name}: {exc.strerror or exc}") from exc
    crc = 0
    for start in range(0, len(view), CHUNK):
        crc = zlib.crc32(view[start : start + CHUNK], crc)
    if crc != expected["crc32"]:
        raise DamagedCheckpoint(f"{path.name}/{name}: checksum mismatch (the file was damaged after writing)")
    return data


def read_into(path: Path, name: str, manifest: Manifest, targets: Iterable[tuple[int, memoryview]]) -> None:
    """Read a file straight into the given (offset, buffer) places, checking its size and CRC-32
    against the manifest; the bytes between places (alignment padding) are checked too."""
    expected = manifest.files.get(name)
    if expected is None:
        raise DamagedCheckpoint(f"{path.name}: manifest lists no {name}")
    crc = 0
    position = 0
    try:
        with open(path / name, "rb", buffering=0) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != expected["size"]:
                raise DamagedCheckpoint(f"{path.name}/{name}: {size} bytes, manifest says {expected['size']}")
            places = sorted(targets, key=lambda place: place[0])
            places.append((size, memoryview(b"")))
            for offset, target in places:
                if offset > position:
                    gap = handle.read(offset - position)
                    crc = zlib.crc32(gap, crc)
                    position += len(gap)
                for start in range(0, len(target), CHUNK):
                    piece = target[start : start + CHUNK]
                    got = handle.readinto(piece)
                    if got != len(piece):
                        raise DamagedCheckpoint(f"{path.name}/{name}: shorter than its size")
                    crc = zlib.crc32(piece, crc)
                position += len(target)
    except OSError as exc:
        raise DamagedCheckpoint(f"{path.name}/{name}: {exc.strerror or exc}") from exc
    if crc != expected["crc32"]:
        raise DamagedCheckpoint(f"{path.name}/{name}: checksum mismatch (the file was damaged after writing)")


def complete_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint folders with a manifest, newest step first (not yet verified)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if step_of(p) is not None and (p / MANIFEST_FILE).exists()]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def quick_check(path: Path) -> str | None:
    """Why a checkpoint with a manifest is damaged, from its manifest and file sizes alone (no
    checksums: cheap enough before every prune); None when it looks whole."""
    try:
        manifest = read_manifest(path)
        for name, entry in manifest.files.items():
            size = (path / name).stat().st_size
            if size != entry["size"]:
                return f"{path.name}/{name}: {size} bytes, manifest says {entry['size']}"
    except DamagedCheckpoint as exc:
        return str(exc)
    except OSError as exc:
        return f"{path.name}: {exc.strerror or exc}"
    return None
