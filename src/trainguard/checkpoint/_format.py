"""The on-disk form of a checkpoint: its names, its manifest, its errors and the lock its writers hold.
Writing it is ``_atomic_write`` (a job of several ranks: ``_shards``), reading it back
``_verified_read``, keeping the newest and setting damaged ones aside ``_retention``.

    <dir>/step-000000001200/tensors.bin     every tensor's raw bytes, 64-byte aligned
    <dir>/step-000000001200/tree.pkl        the rest of the state, tensors replaced by references
    <dir>/step-000000001200/manifest.json   written last: format, step, time, each file's size and CRC-32

A checkpoint is written in <dir>/.tmp-step-...-<pid>/, its files fsynced, renamed into place, the
folder fsynced, and only then is the manifest written (through a temporary file, fsynced, renamed).
A reader trusts a checkpoint only when its manifest exists and the files match it, so a kill at any
moment leaves either the previous checkpoints or a complete new one. A checkpoint found damaged (a
file shorter than its manifest says, a checksum that does not match) is moved aside as
``damaged-step-...-<time>``: never chosen again, never counted as one of the ``keep`` to keep, and
removed only once ``keep`` valid checkpoints were written after it was found.

A job of several ranks (``WORLD_SIZE`` > 1) saves into one shared folder, each rank its own shard:

    <dir>/step-000000001200/rank-00000/{tensors.bin, tree.pkl, manifest.json}   one rank's state, as above
    <dir>/step-000000001200/rank-00001/...
    <dir>/step-000000001200/job.json    written last, by whichever rank completes the set: step, world
                                        size, time, each shard's files

A shard is written like a checkpoint (temporary folder, fsync, rename, manifest last); ``job.json``
is written (temporary file, rename) only once every rank's shard is in place, so a step is complete
for the job exactly when ``job.json`` exists: every rank resumes from the same step. A rank that
starts again removes what it wrote after the newest complete step (its shards of a dead attempt),
so a shard of a dead attempt is never completed by the shards of a later one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1
DATA_FILE = "tensors.bin"
TREE_FILE = "tree.pkl"
MANIFEST_FILE = "manifest.json"
TMP_PREFIX = ".tmp-"
_STEP_NAME = re.compile(r"^step-([0-9]{12,})$")
TMP_NAME = re.compile(r"^\.tmp-step-[0-9]+-([0-9]+)$")
DAMAGED_NAME = re.compile(r"^damaged-step-[0-9]+-([0-9]+)$")
CHUNK = 8 * 1024 * 1024
LOCK_FILE = ".writing.lock"
JOB_FILE = "job.json"
# In a manifest and a job.json: the TRAINGUARD_RUN_ID of the run whose job wrote it, so that a run
# never resumes from another run's state (checkpoint.resume reads it).
WRITER_FIELD = "run"


def writer_stamp() -> dict[str, str]:
    """The writer field for a manifest written now: the run of this job, when trainguard runs it."""
    run = os.environ.get("TRAINGUARD_RUN_ID")
    return {WRITER_FIELD: run} if run else {}
SHARD_NAME = re.compile(r"^rank-([0-9]{5,})$")
SHARD_TMP_NAME = re.compile(r"^\.tmp-rank-([0-9]+)-([0-9]+)$")


class CheckpointError(Exception):
    """A checkpoint could not be written or read; the message says why and what is kept."""


class DamagedCheckpoint(CheckpointError):
    pass


@dataclass(frozen=True)
class Manifest:
    step: int
    time: float
    files: dict[str, dict[str, int]]
    format: int = FORMAT_VERSION
    rank: int | None = None  # a shard of a job of several ranks
    world_size: int | None = None

    @property
    def total_bytes(self) -> int:
        return sum(entry["size"] for entry in self.files.values())


def checkpoint_name(step: int) -> str:
    return f"step-{step:012d}"


def step_of(path: Path) -> int | None:
    match = _STEP_NAME.match(path.name)
    return int(match.group(1)) if match else None


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def is_sharded(path: Path) -> bool:
    """A step folder of a job of several ranks (shards and a job file, not one manifest)."""
    try:
        return (path / JOB_FILE).exists() or any(
            SHARD_NAME.match(p.name) or SHARD_TMP_NAME.match(p.name) for p in path.iterdir()
        )
    except OSError:
        return False


@contextlib.contextmanager
def writing_lock(directory: Path, blocking: bool = True, *, rank: int | None = None):
    """Held by whoever writes into the folder; the kernel drops it when the holder dies, so a folder
    whose lock is free has no save in progress and whatever half-written thing is in it is litter.
    The ranks of one job each hold a lock of their own: their saves never wait for each other.
    A lock file is nobody else's business: private to its owner (one an older version left readable
    is made private too), and never a link to somewhere else."""
    name = LOCK_FILE if rank is None else f".writing.{shard_name(rank)}.lock"
    fd = os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        status = os.fstat(fd)
        if status.st_mode & 0o077 and status.st_uid == os.geteuid():
            os.fchmod(fd, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
