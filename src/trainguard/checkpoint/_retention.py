"""Which checkpoints a folder keeps: the ``keep`` newest valid ones; damaged ones set aside for a
person to look at (and removed once ``keep`` valid ones are younger), what killed saves left behind,
and what the next save pushes out, with its size on disk (for making room before a save)."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from pathlib import Path

from trainguard._proc import pid_alive
from trainguard.checkpoint._format import (
    DAMAGED_NAME,
    MANIFEST_FILE,
    TMP_NAME,
    DamagedCheckpoint,
    is_sharded,
    step_of,
    writing_lock,
)
from trainguard.checkpoint._verified_read import complete_checkpoints, quick_check, read_manifest


def damaged_folders(directory: Path) -> list[Path]:
    """Checkpoints moved aside as damaged (kept for a person to look at), oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if DAMAGED_NAME.match(p.name)]
    return sorted(found, key=lambda p: int(DAMAGED_NAME.match(p.name).group(1)))


def clean_stale(directory: Path) -> list[Path]:
    """Remove what killed saves left behind: temporary folders, and renamed folders whose manifest was
    never written. While another process is saving into the folder, only the temporary folders of
    dead processes are touched. Returns what was removed."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    with writing_lock(directory, blocking=False) as nobody_writing:
        for path in directory.iterdir():
            tmp = TMP_NAME.match(path.name)
            abandoned = (tmp is not None and (nobody_writing or not pid_alive(int(tmp.group(1))))) or (
                nobody_writing
                and step_of(path) is not None
                and not (path / MANIFEST_FILE).exists()
                and not is_sharded(path)  # a step of several ranks: its ranks clean their own shards
            )
            if abandoned:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def move_aside(path: Path, now: float | None = None) -> Path | None:
    """Rename a damaged checkpoint out of the way (``damaged-step-...-<time>``): no reader or pruner
    takes it for a checkpoint again, and a person can still look at it."""
    stamp = math.ceil(1000 * (time.time() if now is None else now))  # milliseconds, never before it was found
    target = path.with_name(f"damaged-{path.name}-{stamp}")
    try:
        os.rename(path, target)
    except OSError:
        return None
    return target


def replaced_by_next_save(directory: Path, keep: int) -> list[Path]:
    """The complete checkpoints the next save pushes out of the ``keep`` newest, oldest first; never
    the newest one (with ``keep=1`` nothing: the only checkpoint stays until its successor is whole)."""
    return complete_checkpoints(directory)[max(keep - 1, 1) :][::-1]


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def prune(directory: Path, keep: int, protect: Path | None = None) -> None:
    """Keep the ``keep`` newest VALID checkpoints; called only after a new one is complete.

    Damaged ones are moved aside instead of being counted (otherwise damaged checkpoints with high
    step numbers would outrank, and delete, every new one), ``protect`` (the checkpoint just written)
    is never deleted, and damaged folders go once ``keep`` valid checkpoints are younger than them."""
    valid = []
    for path in complete_checkpoints(directory):
        if quick_check(path) is None:
            valid.append(path)
        else:
            move_aside(path)
    for old in valid[keep:]:
        if protect is not None and old.name == protect.name:
            continue
        # Remove the manifest first: a half-deleted folder must never look complete.
        with contextlib.suppress(OSError):
            (old / MANIFEST_FILE).unlink()
        shutil.rmtree(old, ignore_errors=True)
    kept = valid[:keep]
    if len(kept) < keep:
        return
    try:
        oldest_kept = min(read_manifest(path).time for path in kept)
    except DamagedCheckpoint:
        return
    for path in directory.iterdir():
        found = DAMAGED_NAME.match(path.name)
        if found and int(found.group(1)) < 1000 * oldest_kept:
            shutil.rmtree(path, ignore_errors=True)
