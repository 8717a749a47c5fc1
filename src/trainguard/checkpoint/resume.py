"""Which checkpoint a run resumes from, when its checkpoints were written and how large the newest
is: the public reader of a run's checkpoint folder that the supervisor, the exporter and the cli
share. A folder's checkpoints are judged by ``layouts`` (every layout trainguard knows); with
``--checkpoint-glob`` the newest matching file whose size has settled counts. A run resumes only
from its own state: a checkpoint whose manifest names another run of this machine (``OtherRuns``)
is passed over, and said so."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard import _untrusted as untrusted
from trainguard.checkpoint import layouts
from trainguard.checkpoint._format import WRITER_FIELD
from trainguard.checkpoint._layout_tree import Checkpoint
from trainguard.checkpoint._retention import folder_bytes

_SHARD = re.compile(r"^rank-[0-9]{5,}$")


@dataclass(frozen=True)
class ResumeChoice:
    path: str | None  # the newest complete checkpoint, or None
    skipped: tuple[str, ...] = ()  # newer ones passed over, "path: why" (reported, never deleted)
    folder_missing: bool = False  # the checkpoint folder does not exist (removed, or not made yet)


@dataclass(frozen=True)
class OtherRuns:
    """Runs whose checkpoints are never resumed from (``ids``: the other runs of this machine), for
    what they wrote after ``since`` (when the resuming run was created: an older checkpoint of an
    ended run is a folder handed over on purpose)."""

    ids: frozenset[str]
    since: float = 0.0


def choose_resume(
    checkpoint_dir: str,
    checkpoint_glob: str | None,
    layout: str = "auto",
    *,
    settle_s: float = 0.2,
    other_runs: OtherRuns | None = None,
) -> ResumeChoice:
    """The newest complete checkpoint of the folder's layout (``--checkpoint-layout``) that none of
    ``other_runs`` wrote, and the newer ones passed over (incomplete, or another run's); or with
    ``--checkpoint-glob`` the newest matching file whose size is not changing (still being written)."""
    relative = checkpoint_glob is None or not os.path.isabs(checkpoint_glob)
    missing = relative and not os.path.isdir(checkpoint_dir)
    if checkpoint_glob is None:
        passed: list[str] = []
        for found in layouts.scan(checkpoint_dir, layout):
            if not found.complete:
                passed.append(found.describe())
            elif writer := _another_runs(found, other_runs):
                passed.append(f"{found.path}: written by run {writer}, another run of this machine")
            else:
                return ResumeChoice(found.path, tuple(passed))
        return ResumeChoice(None, tuple(passed), folder_missing=missing)
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
    return ResumeChoice(None, folder_missing=missing)


def _another_runs(checkpoint: Checkpoint, other_runs: OtherRuns | None) -> str | None:
    """Which of ``other_runs`` wrote the checkpoint (its manifest, a shard's or the job file names
    it), if it was written after they count; None for a checkpoint of this run's, or of nobody known."""
    if other_runs is None or not other_runs.ids or checkpoint.layout != "trainguard":
        return None
    if checkpoint.time < other_runs.since:
        return None
    folder = Path(checkpoint.path)
    records = [folder / "manifest.json", folder / "job.json"]
    with contextlib.suppress(OSError):
        records += [entry / "manifest.json" for entry in folder.iterdir() if _SHARD.match(entry.name)]
    for record in records:
        content = untrusted.load_object(str(record)) if record.is_file() else None
        writer = (content or {}).get(WRITER_FIELD)
        if isinstance(writer, str) and writer in other_runs.ids:
            return writer
    return None


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
