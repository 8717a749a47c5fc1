"""``Checkpointer``: periodic, atomic, asynchronous checkpoints that save on SIGTERM and resume by
themselves. See DESIGN section 5 for the contract; the on-disk form is in ``_format``."""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import json
import logging
import mmap
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from trainguard import progress
from trainguard.checkpoint import _tree
from trainguard.checkpoint._format import (
    DATA_FILE,
    JOB_FILE,
    TREE_FILE,
    CheckpointError,
    DamagedCheckpoint,
    clean_stale,
    clean_stale_shards,
    complete_checkpoints,
    complete_jobs,
    damaged_folders,
    folder_bytes,
    invalidate_job,
    move_aside,
    prune,
    prune_jobs,
    read_into,
    read_manifest,
    read_verified,
    replaced_by_next_save,
    shard_name,
    step_of,
    write_checkpoint,
    write_shard,
    writing_lock,
)
from trainguard.checkpoint.agreement import SavePlans, job_namespace, job_store
from trainguard.checkpoint.stopsignal import StopSignal
from trainguard.probes.memory import available_bytes
from trainguard.units import parse_duration

log = logging.getLogger("trainguard.checkpoint")

# Leave this much memory free after staging: the copy must never be what wakes the OOM killer.
MEMORY_MARGIN = 512 * 1024 * 1024
# A save needs the room of the last one, plus this: the disk must never be what the save fills.
DISK_MARGIN = 1024 * 1024
# A writer that shows no sign of work on the save in flight (no CPU time, no bytes through its system
# calls, no wake-up) for this many times the last save's duration, and at least STUCK_MIN_S, is stuck
# (stopped, hung on a dead mount): it is killed, and training never waits. A slow writer that keeps
# working (a CPU limit, a loaded machine, a slow disk) is never killed for being slow.
STUCK_FACTOR = 3.0
STUCK_MIN_S = 5.0
# How often the writer's activity is read from /proc while a save is in flight.
ACTIVITY_SAMPLE_S = 0.2


_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class _Staging:
    """A growable shared buffer (memfd) that the writer process maps too; reused across saves, so
    its pages stay resident and the copy into it is a plain memcpy."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("trainguard-checkpoint", os.MFD_CLOEXEC)
        self.size = 0
        self.map: mmap.mmap | None = None
        self.bytes_view: Any = None  # a torch uint8 tensor over the map, made when tensors are staged

    def ensure(self, size: int) -> bool:
        if size <= self.size:
            return True
        grow = size - self.size
        available = available_bytes()
        if available is not None and available - grow < MEMORY_MARGIN:
            return False
        new_size = int(size * 1.1) + mmap.PAGESIZE  # room for a state that grows a little
        try:
            os.ftruncate(self.fd, new_size)
            # Allocate the pages and map them now, in bulk: faulting 1 GB of shared memory in page by
            # page during the first copy took 2.9 s here, fallocate + MAP_POPULATE 1.5 s.
            with contextlib.suppress(OSError):
                os.posix_fallocate(self.fd, 0, new_size)
            # The new map is made before the old one goes: when it is refused (ENOMEM under ulimit -v),
            # the buffer stays as it was, whole and usable by the next save that fits in it.
            new_map = mmap.mmap(self.fd, new_size, _MAP_FLAGS, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)  # give back the pages fallocate took
            raise
        if self.map is not None:
            self._unpin()
            self.bytes_view = None
            self.map.close()
        self.map = new_map
        self.size = new_size
        return True

    def copy_in(self, tensors: list[Any], specs: list[_tree.TensorSpec]) -> None:
        import torch

        if self.bytes_view is None:
            self.bytes_view = torch.frombuffer(self.map, dtype=torch.uint8)
        on_gpu = any(t.is_cuda for t in tensors)
        if on_gpu:
            self._pin(torch)
        for tensor, spec in zip(tensors, specs):
            if spec.nbytes:
                target = self.bytes_view[spec.offset : spec.offset + spec.nbytes].view(tensor.dtype)
                # Into pinned memory the device-to-host copies run as DMA, all queued before one sync.
                target.view(tensor.shape).copy_(tensor.detach(), non_blocking=self.pinned)
        if on_gpu and self.pinned:
            torch.cuda.synchronize()

    pinned = False

    def _pin(self, torch: Any) -> None:
        """Page-lock the buffer for the GPU's DMA engine (cudaHostRegister); unpinned copies still
        work when that is refused (no CUDA runtime, locked-memory limits)."""
        if self.pinned:
            return
        address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        try:
            status = torch.cuda.cudart().cudaHostRegister(address, self.size, 0)
        except (RuntimeError, AttributeError) as exc:
            log.info("staging buffer not pinned (%s): GPU tensors are copied unpinned", exc)
            return
        self.pinned = int(status) == 0
        self._address = address

    def _unpin(self) -> None:
        if self.pinned:
            import torch

            with contextlib.suppress(RuntimeError, AttributeError):
                torch.cuda.cudart().cudaHostUnregister(self._address)
            self.pinned = False

    def close(self) -> None:
        self._unpin()
        self.bytes_view = None
        if self.map is not None:
            self.map.close()
            self.map = None
        os.close(self.fd)


class _Writer:
    """The persistent writer process and the one save it may have in flight."""

    def __init__(self, staging_fd: int) -> None:
        parent, child = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainguard.checkpoint._writer", str(child.fileno()), str(staging_fd)],
            pass_fds=(child.fileno(), staging_fd),
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.connection = Connection(parent.detach())
        self.in_flight: dict[str, Any] | None = None
        self.submitted_at = 0.0
        self._active_at = 0.0  # when the writer last showed a sign of work
        self._sampled_at = 0.0
        self._activity: int | None = None

    def submit(self, job: dict[str, Any], *, tree: bytes) -> None:
        """Hand the writer a staged save. ``tree`` stays here, kept to write the save in this process
        should the writer get stuck or die; the writer reads its own copy from the staging buffer."""
        self.in_flight = {**job, "tree": tree}
        self.submitted_at = self._active_at = self._sampled_at = time.monotonic()
        self._activity = self.activity()
        try:
            self.connection.send(job)
        except OSError as exc:  # it died after it was last seen alive (EPIPE, ECONNRESET)
            raise WriterStuck(self.in_flight, died=True) from exc

    def in_flight_for(self) -> float:
        return time.monotonic() - self.submitted_at if self.in_flight is not None else 0.0

    def activity(self) -> int | None:
        """A count that grows whenever the writer does anything: CPU time, bytes through its system
        calls, wake-ups (each page an fsync waits for is one). None where /proc cannot tell."""
        pid = self.process.pid
        total, known = 0, False
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
            known = True
        for name, keys in (("status", ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")),
                           ("io", ("rchar", "wchar"))):  # fmt: skip
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key in keys:
                        total += int(value)
                        known = True
        return total if known else None

    def idle_for(self) -> float:
        """How long the save in flight has gone without a sign of work from the writer (since it was
        submitted, where /proc cannot tell); 0 when none is in flight."""
        if self.in_flight is None:
            return 0.0
        now = time.monotonic()
        if now - self._sampled_at >= ACTIVITY_SAMPLE_S:
            self._sampled_at = now
            activity = self.activity()
            if activity is not None and activity != self._activity:
                self._activity, self._active_at = activity, now
        return now - self._active_at

    def wait(self, patience_s: float | None = None) -> Path | None:
        """The path of the save in flight once it is on disk; raises WriterStuck when the writer
        showed no sign of work for ``patience_s``, or died before it answered (the save is still
        staged). A writer that keeps working is waited for, however slow."""
        job = self.in_flight
        if job is None:
            return None
        try:
            if patience_s is not None:
                while not self.connection.poll(max(0.0, min(2 * ACTIVITY_SAMPLE_S, patience_s - self.idle_for()))):
                    if self.idle_for() >= patience_s:
                        raise WriterStuck(job)
            reply = self.connection.recv()
        except (EOFError, OSError) as exc:
            raise WriterStuck(job, died=True) from exc
        self.in_flight = None
        if not reply["ok"]:
            raise CheckpointError(reply["error"])
        self.last_save_s = float(reply.get("seconds", time.monotonic() - self.submitted_at))
        return Path(reply["path"])

    last_save_s = 0.0  # how long the writer took over its last save, by its own clock

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.connection.close()

    def done(self) -> bool:
        """Whether the save in flight has finished (its reply is waiting), without blocking."""
        return self.in_flight is None or self.connection.poll()

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout_s: float) -> bool:
        """Stop the writer once it is done pruning; killed when it does not exit within ``timeout_s``
        (SIGSTOPped, hung on a dead mount): whether it had to be."""
        # Said, not implied by closing the socket: processes forked from the trainer (DataLoader
        # workers) hold copies of it, so the writer would wait for an EOF that never comes.
        with contextlib.suppress(OSError, ValueError):
            self.connection.send({"exit": True})
        self.connection.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return True
        return False


class WriterStuck(Exception):
    """The writer process did not finish a save in time, or ``died`` before it did; ``job`` is the
    save it was given, still whole in the staging buffer."""

    def __init__(self, job: dict[str, Any], *, died: bool = False) -> None:
        super().__init__(f"step {job['step']}")
        self.job = job
        self.died = died


@contextlib.contextmanager
def _quiet_torch_storage() -> Iterator[None]:
    """torch's own pickling of sparse and quantized tensors warns that TypedStorage is deprecated: its
    business, not the user's, and it would be printed at every save and load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        yield


def _tree_offset(data_size: int) -> int:
    """Where the pickled tree starts in the staging buffer: after the tensors, page-aligned."""
    return (data_size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


def _direct_chunks(tensors: list[Any], specs: list[_tree.TensorSpec]) -> Iterator[memoryview | bytes]:
    """Tensor bytes straight from the tensors (a GPU tensor is copied to the host one at a time)."""
    position = 0
    for tensor, spec in zip(tensors, specs):
        if spec.offset > position:
            yield bytes(spec.offset - position)
        host = tensor.detach().to("cpu").contiguous()
        if spec.nbytes:
            yield _tree.raw_view(host)
        position = spec.offset + spec.nbytes


# How many Checkpointers of each folder name (and rank) this process has joined to its job's store,
# in order: every rank makes them in the same order, so the n-th one of a name is the same on every rank.
_ORDINALS: collections.Counter[tuple[str, int]] = collections.Counter()


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


class Checkpointer:
    """Periodic, atomic, asynchronous checkpoints.

    >>> ckpt = Checkpointer("ckpt", every="30m", keep=3)
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
        self.world_size = world_size if world_size is not None else _env_int("WORLD_SIZE", 1)
        self.rank = rank if rank is not None else _env_int("RANK", 0)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not one of world_size {self.world_size}")
        self.every_s = None if every is None else parse_duration(every)
        self.every_steps = every_steps
        self.keep = keep
        self.asynchronous = asynchronous and sys.platform.startswith("linux")
        self.damaged: list[str] = []  # why checkpoints were skipped by load_latest
        self.last_saved: Path | None = None
        self.last_error: CheckpointError | None = None
        self._clock = clock
        self._last_save_time = clock()
        self._last_saved_step: int | None = None
        self._last_size = 0
        self._stop = StopSignal(install=False)
        self._stop_requested = False
        self._staging: _Staging | None = None
        self._writer: _Writer | None = None
        self._expected_save_s = 0.0  # how long the last asynchronous save took
        self._plans: SavePlans | None = None
        self._store_lost = False
        self._warned_alone = self._warned_late = self._members_checked = False

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"cannot create checkpoint folder {self.directory}: {exc.strerror}") from exc
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
        """True once SIGTERM or SIGUSR1 arrived and the state was saved: leave the training loop."""
        return self._stop_requested

    # ------------------------------------------------------------------ saving
    def maybe_save(self, step: int, state: Any | Callable[[], Any]) -> bool:
        """Save if a signal asked for it (at once, synchronously) or the period has passed. ``state``
        may be a callable, evaluated only when a save happens. Returns whether it saved.

        A failed periodic save (disk full, writer died) is logged and kept in ``last_error``, and
        training goes on with the last good checkpoint; ``save()`` and ``wait()`` raise instead."""
        progress.report_step(step)
        signum, time_due, planned = self._decide(step)
        if signum is not None and not self._stop_requested:
            self._stop_requested = True
            saved = self._save_logged(state, step, blocking=True)
            log.warning("signal %s received: %s step %d; stop the training loop",
                        signum, "saved" if saved else "could not save", step)  # fmt: skip
            progress.report_stop(signum, step)
            return saved
        if not (self._steps_due(step) or time_due):
            return False
        if not planned:  # a save the ranks planned together is waited for: skipped, its step is incomplete
            if self._writer_busy():
                return False  # the previous save is still being written: try again at a later step
            if self._writer is not None and not self._writer.done():
                self._abandon_stuck_writer()
        return self._save_logged(state, step, blocking=None)

    def _writer_busy(self) -> bool:
        """Whether the previous save is still being written by a writer that is not stuck."""
        return self._writer is not None and not self._writer.done() and self._writer.idle_for() < self._stuck_after()

    def _decide(self, step: int) -> tuple[int | None, bool, bool]:
        """(stop signal, save due by time, planned with the other ranks). In a job of several ranks
        a signal one rank received and a period one rank's clock says has passed are taken at one
        step by every rank, planned through torch.distributed's store (see ``agreement``)."""
        signum, time_due = self._stop.received, self._time_due()
        if not self.sharded:
            return signum, time_due, False
        plans = self._save_plans()
        if plans is None:
            if time_due and not self._warned_alone:
                self._warned_alone = True
                log.warning("rank %d of %d decides its saves by time alone (torch.distributed is not running): "
                            "other ranks may save other steps; every_steps saves the same steps on every rank",
                            self.rank, self.world_size)  # fmt: skip
            return signum, time_due, False
        stop = signum if signum is not None and not self._stop_requested else None
        try:
            plan = plans.due(step, wanted=stop is not None or time_due, stop=stop or 0)
            if plan is not None:
                self._check_members(plans)
        except Exception as exc:  # whatever the store raises, training must not die of it
            self._lose_the_store(exc)
            return signum, time_due, False
        if plan is None:
            return None, False, False
        if plans.late and not self._warned_late:
            self._warned_late = True
            log.warning("rank %d read the plan to save step %d late (at step %d): the ranks are not in step, "
                        "that step may not be complete", self.rank, plan.step, step)  # fmt: skip
        return (plan.stop or None), not plan.stop, True

    def _save_plans(self) -> SavePlans | None:
        if self._plans is None and not self._store_lost:
            store = job_store()
            if store is None:
                return None
            ordinal = _ORDINALS[(self.directory.name, self.rank)]
            _ORDINALS[(self.directory.name, self.rank)] += 1
            namespace = job_namespace(self.directory.name, self.world_size, ordinal)
            plans = SavePlans(store, namespace, self.world_size, self._clock)
            try:
                plans.join()
            except Exception as exc:  # the same
                self._lose_the_store(exc)
                return None
            self._plans = plans
        return self._plans

    def _lose_the_store(self, exc: Exception) -> None:
        """The job's store stopped answering (its server's node died, the job is being torn down): each
        rank decides alone from now on; the failure that matters is the one that took the store."""
        self._store_lost, self._plans = True, None
        log.warning("rank %d cannot reach torch.distributed's store (%s): it decides its saves alone from now on",
                    self.rank, exc)  # fmt: skip

    def _check_members(self, plans: SavePlans) -> None:
        """A job of several ranks where some ranks make no Checkpointer (``if rank == 0: ...``) never
        completes a step: said once, at the first plan, with the fix."""
        if self._members_checked:
            return
        self._members_checked = True
        members = plans.members()
        if members < self.world_size:
            log.warning("only %d of the job's %d ranks made a Checkpointer: a step is complete only once every rank "
                        "saved its shard; make one on every rank, or pass world_size=1 on the one rank that saves "
                        "for the job", members, self.world_size)  # fmt: skip

    def _save_logged(self, state: Any | Callable[[], Any], step: int, blocking: bool | None) -> bool:
        try:
            self.wait()  # the save in flight: its failure is its own, and must not cost this one too
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

    def _steps_due(self, step: int) -> bool:
        if self.every_steps is None:
            return False
        last = self._last_saved_step if self._last_saved_step is not None else -1
        if self.sharded:
            # Every rank must save the same steps for a step to complete: periods are counted
            # from step 0, not from this rank's last save, so a save that came late on one rank
            # (its writer was still busy) costs that period alone, never every later one.
            return (step + 1) // self.every_steps > (last + 1) // self.every_steps
        return step - last >= self.every_steps

    def _time_due(self) -> bool:
        return self.every_s is not None and self._clock() - self._last_save_time >= self.every_s

    def save(self, state: Any, step: int, *, blocking: bool | None = None) -> None:
        """Save ``state`` as checkpoint ``step``. Asynchronous unless ``blocking`` (or the instance
        is synchronous): returns once the tensors are copied; ``wait()`` blocks until it is on disk."""
        if step < 0:
            raise ValueError(f"step must be >= 0, not {step}")
        self.wait()
        skeleton, tensors = _tree.flatten(state)
        specs, data_size = _tree.layout(tensors)
        with _quiet_torch_storage():
            tree = pickle.dumps({"skeleton": skeleton, "specs": specs}, protocol=pickle.HIGHEST_PROTOCOL)
        self._check_room_on_disk(step, max(self._last_size, data_size + len(tree)))
        self._last_save_time = self._clock()
        self._last_saved_step = step
        self._last_size = data_size + len(tree)
        blocking = (not self.asynchronous) if blocking is None else blocking
        staged = self._stage(tensors, specs, data_size, tree if not blocking else b"")
        if staged and not blocking:
            try:
                self._submit(step, tree, data_size)
                return
            except WriterStuck:  # the writer died since it was last seen alive: the save is written here
                self._take_over(died=True)
                return
            except OSError as exc:  # no writer process could be started (fork refused)
                log.warning("cannot start the checkpoint writer (%s): saving synchronously", exc)
        data = [memoryview(self._staging.map)[:data_size]] if staged and data_size else _direct_chunks(tensors, specs)
        self.last_saved = self._write(step, tree, data, None)

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

    def _check_room_on_disk(self, step: int, needed: int) -> None:
        """Refuse a save the disk cannot hold: the last checkpoint stays whole."""
        free = _free_bytes(self.directory)
        if free is None:
            return
        if free < needed + DISK_MARGIN and not self.sharded:  # one rank must not remove a step the others count on
            free = self._make_room(step, free, needed)
        if free < needed + DISK_MARGIN:
            raise CheckpointError(
                f"not saving step {step}: {self.directory} has {free / 1e6:.1f} MB free and a checkpoint "
                f"takes {needed / 1e6:.1f} MB; the last checkpoint is kept (free space, or keep fewer checkpoints)"
            )

    def _make_room(self, step: int, free: int, needed: int) -> int:
        """On a disk sized for ``keep`` checkpoints, damaged ones set aside for inspection and then the
        one this save replaces anyway go first (the newest valid one never does). The room after."""
        prune(self.directory, self.keep)  # damaged ones moved aside, so that they are seen as such
        damaged = damaged_folders(self.directory)
        replaced = replaced_by_next_save(self.directory, self.keep)
        if free + sum(folder_bytes(p) for p in damaged + replaced) < needed + DISK_MARGIN:
            return free
        for path in damaged:
            log.warning("%s: no room to save step %d: removing %s, a damaged checkpoint set aside for inspection",
                        self.directory, step, path.name)  # fmt: skip
            shutil.rmtree(path, ignore_errors=True)
        free = _free_bytes(self.directory) or free
        if free < needed + DISK_MARGIN and replaced:
            log.warning("%s: %.1f MB free, a checkpoint takes %.1f MB: removing %s before saving step %d (keep=%d)",
                        self.directory, free / 1e6, needed / 1e6, ", ".join(p.name for p in replaced), step,
                        self.keep)  # fmt: skip
            prune(self.directory, max(self.keep - 1, 1))
            free = _free_bytes(self.directory) or free
        return free

    def _stage(self, tensors: list[Any], specs: list[_tree.TensorSpec], data_size: int, tree: bytes) -> bool:
        """Copy the tensors, and the pickled rest of the state after them, into the shared buffer.

        Everything a save holds goes through shared memory and the message to the writer stays a few
        hundred bytes: a megabyte sent down the socket blocks the trainer as soon as the writer stops
        reading (SIGSTOPped, hung on a dead mount), and then not even SIGTERM's save can run."""
        if not self.asynchronous and not tensors:
            return False
        if data_size == 0 and not tree:
            return True
        try:
            if self._staging is None:
                self._staging = _Staging()
            if not self._staging.ensure(_tree_offset(data_size) + len(tree)):
                log.warning(
                    "not enough free memory to stage %.1f MB for an asynchronous save: saving synchronously",
                    (data_size + len(tree)) / 1e6,
                )
                return False
        except OSError as exc:
            log.warning("cannot stage the checkpoint in memory (%s): saving synchronously", exc)
            return False
        if tensors:
            self._staging.copy_in(tensors, specs)
        if tree:
            offset = _tree_offset(data_size)
            self._staging.map[offset : offset + len(tree)] = tree
        return True

    def _submit(self, step: int, tree: bytes, data_size: int) -> None:
        if self._writer is None or not self._writer.alive():
            if self._writer is not None:
                self._writer.kill()  # died while idle: reaped, its socket closed
            self._writer = _Writer(self._staging.fd)
        self._writer.submit(
            {
                "directory": str(self.directory),
                "step": step,
                "time": time.time(),
                "tree_offset": _tree_offset(data_size),
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
        job = writer.in_flight
        step = job["step"] if job else "?"
        if died:
            log.warning("the checkpoint writer process died while saving step %s; a new one takes over", step)
        else:
            log.warning("the checkpoint writer did not finish step %s in %.0f s, nor show any sign of work for "
                        "%.0f s: killed; a new one takes over",
                        step, writer.in_flight_for(), writer.idle_for())  # fmt: skip
        writer.kill()
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
        self.last_saved = path
        return path

    def wait(self) -> Path | None:
        """Block until the save in flight (if any) is on disk; raise CheckpointError if it failed.
        A writer that does not answer in time is replaced, and the save it held is written here."""
        if self._writer is None:
            return None
        job = self._writer.in_flight
        try:
            path = self._writer.wait(patience_s=self._stuck_after())
        except WriterStuck as exc:
            return self._take_over(died=exc.died)
        if path is not None:
            self.last_saved = path
            # The writer's own time for the save: the time since it was submitted also counts how
            # long nobody asked (a whole save period), and SIGTERM's save would wait 3 times that.
            self._expected_save_s = self._writer.last_save_s
            if job is not None:
                progress.report_saved(job["step"], str(path), job["time"])
        return path

    def _write_staged(self, job: dict[str, Any]) -> Path:
        """Write a save that a killed writer held, from the same staging buffer, in this process."""
        data = [memoryview(self._staging.map)[: job["data_size"]]] if job["data_size"] and self._staging else []
        return self._write(job["step"], job["tree"], data, job["time"])

    # ------------------------------------------------------------------ loading
    def load_latest(self, map_location: str | None = "cpu") -> Any:
        """The newest complete checkpoint whose files match their manifest, or None. Damaged ones are
        skipped, logged and listed in ``self.damaged``. Tensors load on ``map_location``."""
        self.wait()
        for path in self._complete():
            if self.sharded:
                self._check_world_size(path)
            try:
                state = self._load(self._own(path), map_location)
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
            self._last_saved_step = step_of(path)
            self._last_save_time = self._clock()
            progress.report_resumed(self._last_saved_step)
            return state
        return None

    def _check_world_size(self, path: Path) -> None:
        try:
            saved = json.loads((path / JOB_FILE).read_text(encoding="utf-8")).get("world_size")
        except (OSError, ValueError, AttributeError):
            return  # read again as the shard's own manifest below
        if saved != self.world_size:
            raise CheckpointError(
                f"{path.name} was saved by {saved} ranks and this job has {self.world_size}: every rank needs its own "
                "shard (start the job with the same number of ranks)"
            )

    def latest_path(self) -> Path | None:
        found = self._complete()
        return found[0] if found else None

    @staticmethod
    def _load(path: Path, map_location: str | None) -> Any:
        manifest = read_manifest(path)
        try:
            with _quiet_torch_storage():
                tree = pickle.loads(read_verified(path, TREE_FILE, manifest))
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
            raise DamagedCheckpoint(f"{path.name}/{TREE_FILE}: {exc}") from exc
        specs: list[_tree.TensorSpec] = tree["specs"]
        if not specs:
            return _tree.rebuild(tree["skeleton"], lambda index: None)
        import torch

        # Each tensor gets its own storage, read straight from the file: no second copy of the state
        # in memory, and nothing later (torch.save, set_rng_state) sees a view into a shared buffer.
        tensors = [torch.empty(spec.shape, dtype=getattr(torch, spec.dtype)) for spec in specs]
        read_into(path, DATA_FILE, manifest, [(s.offset, _tree.raw_view(t)) for s, t in zip(specs, tensors)])

        def make(index: int) -> Any:
            device = map_location if map_location is not None else specs[index].device
            return tensors[index] if device == "cpu" else tensors[index].to(device)

        return _tree.rebuild(tree["skeleton"], make)

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

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
