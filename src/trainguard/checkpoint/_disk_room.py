"""The checkpoint folder, and room on disk for the next save: a save the disk cannot hold is refused
before anything is written, so the last checkpoint stays whole. On a disk sized for ``keep``
checkpoints, damaged ones set aside and then the one the save replaces anyway make room first (never
the newest valid one)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from trainguard.checkpoint._format import CheckpointError
from trainguard.checkpoint._retention import damaged_folders, folder_bytes, prune, replaced_by_next_save

log = logging.getLogger("trainguard.checkpoint")

# A save needs the room of the last one, plus this: the disk must never be what the save fills.
DISK_MARGIN = 1024 * 1024


def make_folder(directory: Path) -> None:
    """Create the checkpoint folder (and its parents) where it does not exist yet."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:  # "File exists": say which, and what it is
        in_the_way = (p for p in (directory, *directory.parents) if (p.is_symlink() or p.exists()) and not p.is_dir())
        blocker = next(in_the_way, directory)
        what = "a symbolic link to nothing" if blocker.is_symlink() and not blocker.exists() else "a file, not a folder"
        raise CheckpointError(f"cannot keep checkpoints in {directory}: {blocker} is {what}") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot create checkpoint folder {directory}: {exc.strerror or exc}") from exc


def free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def check_room(directory: Path, step: int, needed: int, keep: int, *, sharded: bool) -> None:
    """Refuse a save the disk cannot hold: the last checkpoint stays whole."""
    free = free_bytes(directory)
    if free is None:
        return
    if free < needed + DISK_MARGIN and not sharded:  # one rank must not remove a step the others count on
        free = make_room(directory, step, free, needed, keep)
    if free < needed + DISK_MARGIN:
        raise CheckpointError(
            f"not saving step {step}: {directory} has {free / 1e6:.1f} MB free and a checkpoint "
            f"takes {needed / 1e6:.1f} MB; the last checkpoint is kept (free space, or keep fewer checkpoints)"
        )


def make_room(directory: Path, step: int, free: int, needed: int, keep: int) -> int:
    """On a disk sized for ``keep`` checkpoints, damaged ones set aside for inspection and then the
    one this save replaces anyway go first (the newest valid one never does). The room after."""
    prune(directory, keep)  # damaged ones moved aside, so that they are seen as such
    damaged = damaged_folders(directory)
    replaced = replaced_by_next_save(directory, keep)
    if free + sum(folder_bytes(p) for p in damaged + replaced) < needed + DISK_MARGIN:
        return free
    for path in damaged:
        log.warning("%s: no room to save step %d: removing %s, a damaged checkpoint set aside for inspection",
                    directory, step, path.name)  # fmt: skip
        shutil.rmtree(path, ignore_errors=True)
    free = free_bytes(directory) or free
    if free < needed + DISK_MARGIN and replaced:
        log.warning("%s: %.1f MB free, a checkpoint takes %.1f MB: removing %s before saving step %d (keep=%d)",
                    directory, free / 1e6, needed / 1e6, ", ".join(p.name for p in replaced), step,
                    keep)  # fmt: skip
        prune(directory, max(keep - 1, 1))
        free = free_bytes(directory) or free
    return free
