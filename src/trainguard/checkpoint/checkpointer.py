"""``Checkpointer``: periodic, atomic, asynchronous checkpoints that save on SIGTERM and resume by
themselves. See DESIGN section 5 for the contract. Here: deciding at a step end whether to save (a
stop signal, a save request, a period), the save, the rescue of a save whose writer got stuck or
died, loading, closing. The periods and a postponed save are in ``_schedule``, save requests in
``saverequest``; the on-disk form is in ``_format``; the staging buffer in ``_staging``, the writer
process it feeds in ``_writer`` and ``_writer_control``, room on disk in ``_disk_room``, the plan of
a job's ranks in ``_rank_plan``."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard import progress
from trainguard.checkpoint import _tree
from trainguard.checkpoint._atomic_write import write_checkpoint
from trainguard.checkpoint._disk_room import check_room, make_folder
from trainguard.checkpoint._folder_claim import claim, release
from trainguard.checkpoint._format import CheckpointError, DamagedCheckpoint, shard_name, step_of, writing_lock
from trainguard.checkpoint._rank_plan import RankPlan, rank_and_world_size
from trainguard.checkpoint._retention import clean_stale, move_aside, prune
from trainguard.checkpoint._schedule import SaveSchedule
from trainguard.checkpoint._shards import (
    check_world_size,
    clean_stale_shards,
    complete_jobs,
    invalidate_job,
    prune_jobs,
    write_shard,
)
from trainguard.checkpoint._staging import StagingBuffer, stage, tree_offset
from trainguard.checkpoint._state_files import direct_chunks, load_state, pickle_tree
from trainguard.checkpoint._verified_read import complete_checkpoints
from trainguard.checkpoint._writer_control import STUCK_FACTOR, STUCK_MIN_S, WriterProcess, WriterStuck
from trainguard.checkpoint.agreement import job_store
from trainguard.checkpoint.saverequest import STOP_SIGNAL, SaveRequest, SaveRequests
from trainguard.checkpoint.stopsignal import StopSignal

log = logging.getLogger("trainguard.checkpoint")


class Checkpointer:
    """Periodic, atomic, asynchronous checkpoints.

    >>> ckpt = Checkpointer("ckpt", every="30m", keep=3)  # or every="auto", or every_steps=N
    >>> state = ckpt.load_latest()
    >>> start = state["step"] + 1 if state else 0
    >>> for step in range(start, total_steps):
    ...     train_one_step()
    ...     ckpt.maybe_save(step, lambda: {"step": step, "model": model.state_dict()})
    ...     if ckpt.stop_requested:
    ...         break

    In a job of several ranks (``WORLD_SIZE`` > 1, as torchrun, DeepSpeed and Accelerate set it)
    every rank makes its own Checkpointer on the same shared folder and saves its own state: each
    save is one shard per rank, and a step counts only once every rank's shard is in place, so
    ``load_latest`` gives every rank the same step. ``rank`` and ``world_size`` override the
    environment (``world_size=1`` on rank 0 alone: one process saves for the job).

    ``every="auto"`` saves at the goodput-optimal period (Young–Daly) from the measured cost of a
    save and ``TRAINGUARD_MTBF_S`` (see ``_schedule``). Under ``trainguard run`` a save request of
    the supervisor (``TRAINGUARD_SAVE_REQUEST_FILE``, see ``saverequest``) is taken at the next step.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        every: float | str | None = "1h",
        every_steps: int | None = None,
        keep: int = 3,
        asynchronous: bool = True,
        handle_signals: bool = True,
        clock: Callable[[], float] = time.monotonic,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        directory = directory or os.environ.get("TRAINGUARD_CHECKPOINT_DIR")
        if not directory:
            raise CheckpointError("Checkpointer needs a folder (or TRAINGUARD_CHECKPOINT_DIR, set by trainguard run)")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be at least 1, not {every_steps}")
        self.directory = Path(directory)
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not one of world_size {self.world_size}")
        self._schedule = SaveSchedule(every, every_steps, sharded=self.world_size > 1, clock=clock)
        self.keep = keep
        self.asynchronous = asynchronous and sys.platform.startswith("linux")
        self.damaged: list[str] = []  # why checkpoints were skipped by load_latest
        self.last_saved: Path | None = None
        self.last_error: CheckpointError | None = None
        self._last_size = 0
        self._stop = StopSignal(install=False)
        self._stop_requested = False
        self._requests = SaveRequests()
        self._staging: StagingBuffer | None = None
        self._writer: WriterProcess | None = None
        self._expected_save_s = 0.0  # how long the last asynchronous save took
        self._rank_plan = RankPlan(self.directory.name, self.rank, self.world_size, clock, job_store)

        make_folder(self.directory)
        # Before anything is cleaned as stale: another run's save in flight is not stale.
        self._claim = claim(self.directory, os.environ.get("TRAINGUARD_RUN_ID") if self.world_size == 1 else None)
        stale = clean_stale_shards(self.directory, self.rank) if self.sharded else clean_stale(self.directory)
        for removed in stale:
            log.info("removed %s, left by a save that was killed", removed.name)
        progress.report_checkpoint_dir(str(self.directory.resolve()))
        newest = self._complete()
        if newest:
            with contextlib.suppress(OSError):
                self._last_size = sum(p.stat().st_size for p in self._own(newest[0]).iterdir())
        if handle_signals:
            self._stop.install()
        self_ref = weakref.ref(self)
        atexit.register(lambda: (obj := self_ref()) is not None and obj.close())

    @property
    def every_s(self) -> float | None:
        """Seconds between periodic saves (``every="auto"``: the period chosen now), or None."""
        return self._schedule.every_s

    @property
    def every_why(self) -> str | None:
        """Why ``every="auto"`` chose ``every_s`` (None for a fixed period)."""
        return self._schedule.why.en if self._schedule.why else None

    @property
    def every_steps(self) -> int | None:
        return self._schedule.every_steps

    @property
    def sharded(self) -> bool:
        """Whether each save is one shard of a job of several ranks."""
        return self.world_size > 1

    def _complete(self) -> list[Path]:
        return complete_jobs(self.directory) if self.sharded else complete_checkpoints(self.directory)

    def _own(self, checkpoint: Path) -> Path:
        """Where this process's state is inside a checkpoint: its shard, or the checkpoint itself."""
        return checkpoint / shard_name(self.rank) if self.sharded else checkpoint

    # ------------------------------------------------------------------ signals
    @property
    def stop_requested(self) -> bool:
        """True once SIGTERM or SIGUSR1 (or a save request that says "then": "stop") arrived and the
        state was saved: leave the training loop."""
        self._stop.polled = True  # the loop acts on stop signals: one that arrives waits for it
        return self._stop_requested

    # ------------------------------------------------------------------ saving
    def maybe_save(self, step: int, state: Any | Callable[[], Any]) -> bool:
        """Save if a signal asked for it (at once, synchronously), the supervisor asked for it (a save
        request) or the period has passed. ``state`` may be a callable, evaluated only when a save
        happens. Returns whether it saved.

        A failed periodic save (disk full, writer died) is logged and kept in ``last_error``, and
        training goes on with the last good checkpoint; ``save()`` and ``wait()`` raise instead."""
        progress.report_step(step)
        self._notice_answered_request()
        request = self._requests.check()
        signum, time_due, planned = self._decide(step, request)
        if signum is not None and not self._stop_requested:
            return self._save_and_stop(state, step, signum, request)
        if not (self._schedule.steps_due(step) or time_due):
            return False
        # A save the ranks planned together is waited for (skipped, its step would be incomplete),
        # and so is one the supervisor asked for: it expects a death soon.
        if not planned and not (request is not None and not request.stop):
            if self._writer_busy():
                self._schedule.postpone(step, state)  # the previous save is still being written: later
                return False
            if self._writer is not None and not self._writer.done():
                self._abandon_stuck_writer()
        return self._save_logged(state, step, blocking=None)

    def _save_and_stop(self, state: Any | Callable[[], Any], step: int, signum: int,
                       request: SaveRequest | None) -> bool:  # fmt: skip
        self._stop_requested = True
        saved = self._save_logged(state, step, blocking=True)
        asked = f"save request {request.id}" if request is not None and request.stop else f"signal {signum} received"
        log.warning("%s: %s step %d; stop the training loop", asked, "saved" if saved else "could not save", step)
        progress.report_stop(signum, step)
        return saved

    def _notice_answered_request(self) -> None:
        """The save that answers a save request is on disk: the supervisor hears it at this step, not
        at the next save."""
        if self._requests.answering is None or self._writer is None or not self._writer.done():
            return
        try:
            self._wait_in_flight()
        except CheckpointError as exc:
            self.last_error = exc
            log.error("checkpoint not saved: %s", exc)

    def _writer_busy(self) -> bool:
        """Whether the previous save is still being written by a writer that is not stuck."""
        return self._writer is not None and not self._writer.done() and self._writer.idle_for() < self._stuck_after()

    def _decide(self, step: int, request: SaveRequest | None) -> tuple[int | None, bool, bool]:
        """(stop signal, save due by time or asked for, planned with the other ranks). In a job of
        several ranks a signal or a save request one rank received and a period one rank's clock
        says has passed are taken at one step by every rank, planned through torch.distributed's
        store (see ``_rank_plan``)."""
        signum = self._stop.received
        if signum is None and request is not None and request.stop:
            signum = STOP_SIGNAL
        due = self._schedule.time_due() or (request is not None and not request.stop)
        if not self.sharded:
            return signum, due, False
        return self._rank_plan.decide(step, signum, due, stop_requested=self._stop_requested)

    def _save_logged(self, state: Any | Callable[[], Any], step: int, blocking: bool | None) -> bool:
        try:
            self._wait_in_flight()  # the save in flight: its failure is its own, and must not cost this one too
        except CheckpointError as exc:
            self.last_error = exc
            log.error("checkpoint not saved: %s", exc)
        try:
            self.save(state() if callable(state) else state, step, blocking=blocking)
        except CheckpointError as exc:
            self.last_error = exc
            log.error("checkpoint not saved: %s", exc)
            return False
        return True

    def save(self, state: Any, step: int, *, blocking: bool | None = None) -> None:
        """Save ``state`` as checkpoint ``step``. Asynchronous unless ``blocking`` (or the instance
        is synchronous): returns once the tensors are copied; ``wait()`` blocks until it is on disk."""
        if step < 0:
            raise ValueError(f"step must be >= 0, not {step}")
        self._wait_in_flight()
        started = time.monotonic()
        self._save_now(state, step, blocking)
        if blocking is None:  # what a periodic save costs the training (a stop's blocking save is no guide)
            self._schedule.measured(time.monotonic() - started)

    def _save_now(self, state: Any, step: int, blocking: bool | None) -> None:
        skeleton, tensors = _tree.flatten(state)
        specs, data_size = _tree.layout(tensors)
        tree = pickle_tree(skeleton, specs)
        check_room(self.directory, step, max(self._last_size, data_size + len(tree)), self.keep, sharded=self.sharded)
        self._schedule.saving(step)
        self._requests.taken()
        self._last_size = data_size + len(tree)
        blocking = (not self.asynchronous) if blocking is None else blocking
        self._staging, staged = stage(
            self._staging, tensors, specs, data_size, tree if not blocking else b"", asynchronous=self.asynchronous
        )
        if staged and not blocking:
            try:
                self._submit(step, tree, data_size)
                return
            except WriterStuck:  # the writer died since it was last seen alive: the save is written here
                self._take_over(died=True)
                return
            except OSError as exc:  # no writer process could be started (fork refused)
                log.warning("cannot start the checkpoint writer (%s): saving synchronously", exc)
        data = [memoryview(self._staging.map)[:data_size]] if staged and data_size else direct_chunks(tensors, specs)
        self._on_disk(step, self._write(step, tree, data, None))

    def _on_disk(self, step: int, path: Path, saved_at: float | None = None) -> Path:
        self.last_saved = path
        self._requests.saved(step, saved_at)
        return path

    def _write(self, step: int, tree: bytes, data: Any, wall_time: float | None) -> Path:
        if self.sharded:
            path = write_shard(self.directory, step, self.rank, self.world_size, tree, data, wall_time=wall_time)
            prune_jobs(self.directory, self.keep, protect=path, rank=self.rank)
            return path
        prune(self.directory, self.keep)  # what a kill between an earlier save and its pruning left
        saved_at = time.time() if wall_time is None else wall_time
        path = write_checkpoint(self.directory, step, tree, data, wall_time=saved_at)
        progress.report_saved(step, str(path), saved_at)
        prune(self.directory, self.keep, protect=path)
        return path

    def _submit(self, step: int, tree: bytes, data_size: int) -> None:
        if self._writer is None or not self._writer.alive():
            if self._writer is not None:
                self._writer.kill()  # died while idle: reaped, its socket closed
            self._writer = WriterProcess(self._staging.fd)
        self._writer.submit(
            {
                "directory": str(self.directory),
                "step": step,
                "time": time.time(),
                "tree_offset": tree_offset(data_size),
                "tree_size": len(tree),
                "data_size": data_size,
                "buffer_size": self._staging.size,
                "keep": self.keep,
                "rank": self.rank if self.sharded else None,
                "world_size": self.world_size,
            },
            tree=tree,
        )

    @property
    def saving(self) -> bool:
        """Whether an asynchronous save is still being written (never blocks)."""
        return self._writer is not None and not self._writer.done()

    def _stuck_after(self) -> float:
        return max(STUCK_MIN_S, STUCK_FACTOR * self._expected_save_s)

    def _abandon_stuck_writer(self, *, died: bool = False) -> dict[str, Any] | None:
        """Kill a writer that stopped answering (SIGSTOPped, hung on a dead mount), or reap one that
        died; a fresh one is started by the next save. Returns the save it never finished."""
        writer, self._writer = self._writer, None
        if writer is None:
            return None
        job = writer.abandon(died=died)
        self._clean_after_writer()
        return job

    def _clean_after_writer(self) -> None:
        """Remove what a killed writer left half-written (its temporary folder, a folder renamed
        before its manifest was written), so that nothing of it outlives the save it abandoned."""
        if self.sharded:
            clean_stale_shards(self.directory, self.rank, dead_attempt=False)
        else:
            clean_stale(self.directory)

    def _take_over(self, *, died: bool) -> Path | None:
        """Write here, from the staging buffer, the save a stuck or dead writer held."""
        job = self._abandon_stuck_writer(died=died)
        if job is None:
            return None
        started = time.monotonic()
        path = self._write_staged(job)  # reported by the write itself
        self._expected_save_s = time.monotonic() - started
        return self._on_disk(job["step"], path, job["time"])

    def wait(self) -> Path | None:
        """Block until the save in flight (if any) is on disk, and the save that fell due while it was
        being written is taken and on disk too; raise CheckpointError if one failed. A writer that
        does not answer in time is replaced, and the save it held is written here."""
        path = self._wait_in_flight()
        postponed = self._schedule.take_postponed()
        if postponed is not None:
            step, state = postponed
            log.info("saving step %d now: its save fell due while the previous one was being written", step)
            self.save(state() if callable(state) else state, step)
            path = self._wait_in_flight()
        return path

    def _wait_in_flight(self) -> Path | None:
        if self._writer is None:
            return None
        job = self._writer.in_flight
        try:
            path = self._writer.wait(patience_s=self._stuck_after())
        except WriterStuck as exc:
            return self._take_over(died=exc.died)
        if path is not None:  # the save ``job`` is on disk
            # The writer's own time for the save: the time since it was submitted also counts how
            # long nobody asked (a whole save period), and SIGTERM's save would wait 3 times that.
            self._expected_save_s = self._writer.last_save_s
            progress.report_saved(job["step"], str(path), job["time"])
            self._on_disk(job["step"], path, job["time"])
        return path

    def _write_staged(self, job: dict[str, Any]) -> Path:
        """Write a save that a killed writer held, from the same staging buffer, in this process."""
        data = [memoryview(self._staging.map)[: job["data_size"]]] if job["data_size"] and self._staging else []
        return self._write(job["step"], job["tree"], data, job["time"])

    # ------------------------------------------------------------------ loading
    def load_latest(self, map_location: str | None = "cpu") -> Any:
        """The newest complete checkpoint whose files match their manifest, or None. Damaged ones are
        skipped, logged and listed in ``self.damaged``. Tensors load on ``map_location``."""
        self._wait_in_flight()
        for path in self._complete():
            if self.sharded:
                check_world_size(path, self.world_size)
            try:
                state = load_state(self._own(path), map_location)
            except DamagedCheckpoint as exc:
                if self.sharded:
                    # The other ranks may have loaded this step already: no rank may take another
                    # one now. The step stops being complete, and the next attempt of every rank
                    # resumes from the previous one.
                    invalidate_job(path)
                    raise CheckpointError(
                        f"rank {self.rank}'s shard of {path.name} is damaged ({exc}); {path.name} no longer counts "
                        "as complete: restart the job and every rank resumes from the previous complete step"
                    ) from exc
                self.damaged.append(str(exc))
                with writing_lock(self.directory):
                    aside = move_aside(path)
                log.warning("skipping damaged checkpoint: %s (moved aside as %s)", exc, aside.name if aside else "?")
                continue
            self._schedule.resumed(step_of(path))
            progress.report_resumed(step_of(path))
            return state
        return None

    def latest_path(self) -> Path | None:
        found = self._complete()
        return found[0] if found else None

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Finish the save in flight and stop the writer process. Called at exit, too."""
        try:
            self.wait()
        finally:
            if self._writer is not None:
                # Nothing is in flight now: the writer is at most pruning. A stopped one is not
                # waited for (a minute, past a scheduler's grace period): it is killed.
                patience = self._stuck_after()
                if self._writer.close(timeout_s=patience):
                    log.warning("the checkpoint writer did not exit in %.0f s: killed", patience)
                    self._clean_after_writer()
                self._writer = None
            if self._staging is not None:
                self._staging.close()
                self._staging = None
            self._stop.close()
            release(self._claim, self.directory, os.environ.get("TRAINGUARD_RUN_ID"))
            self._claim = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
