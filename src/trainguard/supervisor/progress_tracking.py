"""What the supervisor learns of a job's progress and checkpoints while it runs: whether it moves
(new output, a new checkpoint, a new step it reported), each checkpoint recorded once at the time it
was written, and where the job really keeps its checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
from typing import TYPE_CHECKING, Any

from trainguard import progress
from trainguard.checkpoint import layouts
from trainguard.checkpoint.resume import checkpoint_bytes, find_resume
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt, Run
from trainguard.supervisor.attempt_files import progress_file
from trainguard.supervisor.job import JobOptions

if TYPE_CHECKING:
    from trainguard.supervisor.watch import AttemptWatch

PROGRESS_SAVE_S = 5.0  # how often the job's reported progress is written to the registry


class ProgressTracker:
    """The job's progress and checkpoints. It holds the job's options: the checkpoint folder in them
    is the one the job really uses, learnt from the job's own report."""

    def __init__(self, journal: Journal, run: Run, options: JobOptions) -> None:
        self.journal = journal
        self.run = run
        self.options = options
        # Checkpoints recorded as events (path -> the time it was written): each is recorded once.
        self._checkpoints_seen: dict[str, float] = {}

    def recall_recorded_checkpoints(self) -> None:
        self._checkpoints_seen = self.journal.checkpoints_recorded()

    def newest_checkpoint(self) -> str | None:
        opts = self.options
        return find_resume(opts.checkpoint_dir, opts.checkpoint_glob, layout=opts.checkpoint_layout, settle_s=0)

    def checkpoint_bytes(self) -> int | None:
        newest = self.newest_checkpoint()
        if newest is None:
            return None
        return checkpoint_bytes(newest)

    def check_progress(self, watch: AttemptWatch, now: float) -> None:
        """New output, a new checkpoint or a new step reported by the job all count as progress."""
        size = watch.log_size()
        latest = self.newest_checkpoint()
        reported = progress.read(progress_file(self.run.run_dir, watch.attempt.n))
        step_moved = reported.get("step_time") != (watch.attempt.progress or {}).get("step_time")
        self.record_checkpoints(watch.attempt, reported, scan=latest != watch.last_checkpoint)
        if size != watch.last_log_size or latest != watch.last_checkpoint or step_moved:
            watch.last_log_size = size
            watch.last_checkpoint = latest
            watch.last_progress_mono = now
        self.learn_checkpoint_dir(reported)
        if reported and step_moved:
            watch.attempt.progress = reported
            if now - watch.last_progress_saved >= PROGRESS_SAVE_S:
                watch.last_progress_saved = now
                self.journal.save_progress(watch.attempt)

    def learn_checkpoint_dir(self, reported: dict) -> None:
        """The job keeps its checkpoints elsewhere than TRAINGUARD_CHECKPOINT_DIR (it gave its own
        folder to Checkpointer): resume and report from where they really are."""
        folder = reported.get("checkpoint_dir")
        if not folder or folder == self.options.checkpoint_dir or self.options.checkpoint_glob:
            return
        self.journal.event("checkpoint_dir_learned", {"from": self.options.checkpoint_dir, "to": folder})
        self.options = dataclasses.replace(self.options, checkpoint_dir=folder)
        self.journal.update(options={**self.run.options, "checkpoint_dir": folder})

    def record_checkpoints(self, attempt: Attempt, reported: dict[str, Any], *, scan: bool) -> None:
        """Record each checkpoint once, as an event at the time it was written, so that the report
        and goodput see every one even after pruning removed it: those the job reported saving
        (``trainguard.progress``), and with ``scan`` the complete ones in the folder now."""
        found: list[tuple[str, int | None, float]] = []
        for entry in reported.get("saves") or ():
            with contextlib.suppress(TypeError, ValueError, IndexError):
                found.append((str(entry[2]), int(entry[0]), float(entry[1])))
        if scan:
            found += self._complete_checkpoints()
        for path, step, written in sorted(found, key=lambda item: item[2]):
            seen = self._checkpoints_seen.get(path)
            if seen is not None and abs(seen - written) < 1.0:
                continue
            self._checkpoints_seen[path] = written
            during = attempt.n if written >= attempt.started_at else None
            self.journal.event("checkpoint", {"attempt": during, "path": path, "step": step}, at=written)

    def _complete_checkpoints(self) -> list[tuple[str, int | None, float]]:
        opts = self.options
        if opts.checkpoint_glob is None:
            return [(c.path, c.step, c.time) for c in layouts.scan(opts.checkpoint_dir, opts.checkpoint_layout)
                    if c.complete]  # fmt: skip
        pattern = opts.checkpoint_glob
        if not os.path.isabs(pattern):
            pattern = os.path.join(opts.checkpoint_dir, pattern)
        found = []
        for path in glob.glob(pattern):
            with contextlib.suppress(OSError):
                if os.path.isfile(path) and os.path.getsize(path) > 0:
                    found.append((path, None, os.path.getmtime(path)))
        return found
