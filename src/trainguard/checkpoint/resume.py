"""Which checkpoint a run resumes from, when its checkpoints were written and how large the newest
is: the public reader of a run's checkpoint folder that the supervisor, the exporter and the cli
share. A folder's checkpoints are judged by ``layouts`` (every layout trainguard knows); with
``--checkpoint-glob`` the newest matching file whose size has settled counts."""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoint import layouts
from trainguard.checkpoint._retention import folder_bytes


@dataclass(frozen=True)
class ResumeChoice:
    path: str | None  # the newest complete checkpoint, or None
    skipped: tuple[str, ...] = ()  # newer incomplete ones, "path: why" (reported, never deleted)


def choose_resume(
    checkpoint_dir: str, checkpoint_glob: str | None, layout: str = "auto", *, settle_s: float = 0.2
) -> ResumeChoice:
    """The newest complete checkpoint of the folder's layout (``--checkpoint-layout``), and the newer
    incomplete ones passed over; or with ``--checkpoint-glob`` the newest matching file whose size is
    not changing (still being written)."""
    if checkpoint_glob is None:
        found = layouts.scan(checkpoint_dir, layout)
        chosen = next((c for c in found if c.complete), None)
        newer = found[: found.index(chosen)] if chosen else found
        return ResumeChoice(chosen.path if chosen else None, tuple(c.describe() for c in newer if not c.complete))
    pattern = checkpoint_glob if os.path.isabs(checkpoint_glob) else os.path.join(checkpoint_dir, checkpoint_glob)
    candidates = sorted((p for p in glob.glob(pattern) if os.path.isfile(p)), key=os.path.getmtime, reverse=True)
    for path in candidates:
        try:
            size = os.path.getsize(path)
            time.sleep(settle_s)
            if os.path.getsize(path) == size and size > 0:
                return ResumeChoice(path)
        except OSError:
            continue
    return ResumeChoice(None)


def find_resume(
    checkpoint_dir: str, checkpoint_glob: str | None, *, layout: str = "auto", settle_s: float = 0.2
) -> str | None:
    """The path ``choose_resume`` picks."""
    if checkpoint_glob is None:
        newest = layouts.newest_complete(checkpoint_dir, layout)
        return newest.path if newest else None
    return choose_resume(checkpoint_dir, checkpoint_glob, layout, settle_s=settle_s).path


def checkpoint_times(
    checkpoint_dir: str, checkpoint_glob: str | None, *, layout: str = "auto", limit: int = 6
) -> list[float]:
    """When the newest ``limit`` complete checkpoints were written, newest first: those of the
    folder's layout, or with ``--checkpoint-glob`` the matching non-empty files."""
    if checkpoint_glob is None:
        times = [c.time for c in layouts.scan(checkpoint_dir, layout) if c.complete]
    else:
        pattern = checkpoint_glob if os.path.isabs(checkpoint_glob) else os.path.join(checkpoint_dir, checkpoint_glob)
        times = []
        for path in glob.glob(pattern):
            try:
                if os.path.isfile(path) and os.path.getsize(path) > 0:
                    times.append(os.path.getmtime(path))
            except OSError:  # removed by pruning meanwhile
                continue
    return sorted(times, reverse=True)[:limit]


def checkpoint_bytes(path: str) -> int | None:
    """The size of one checkpoint on disk: a file, or every file below a folder (a sharded step holds
    a folder per rank); None when it is gone."""
    target = Path(path)
    try:
        return folder_bytes(target) if target.is_dir() else target.stat().st_size
    except OSError:
        return None
