"""The on-disk form of a checkpoint, and the one function that writes it.

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
import errno
import fcntl
import json
import math
import os
import re
import shutil
import time
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trainguard._proc import pid_alive

FORMAT_VERSION = 1
DATA_FILE = "tensors.bin"
TREE_FILE = "tree.pkl"
MANIFEST_FILE = "manifest.json"
TMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^step-([0-9]{12,})$")
_TMP_NAME = re.compile(r"^\.tmp-step-[0-9]+-([0-9]+)$")
_DAMAGED_NAME = re.compile(r"^damaged-step-[0-9]+-([0-9]+)$")
CHUNK = 8 * 1024 * 1024
LOCK_FILE = ".writing.lock"
JOB_FILE = "job.json"
_SHARD_NAME = re.compile(r"^rank-([0-9]{5,})$")
_SHARD_TMP_NAME = re.compile(r"^\.tmp-rank-([0-9]+)-([0-9]+)$")


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
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def is_sharded(path: Path) -> bool:
    """A step folder of a job of several ranks (shards and a job file, not one manifest)."""
    try:
        return (path / JOB_FILE).exists() or any(
            _SHARD_NAME.match(p.name) or _SHARD_TMP_NAME.match(p.name) for p in path.iterdir()
        )
    except OSError:
        return False


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, chunks: Iterable[memoryview | bytes]) -> dict[str, int]:
    """Write and fsync a file; its CRC-32 is computed on a second thread while the bytes are written
    (zlib and os.write both release the GIL), so checksumming costs no time."""
    size = 0
    running = [0]

    def checksum(piece: memoryview) -> None:
        running[0] = zlib.crc32(piece, running[0])

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with ThreadPoolExecutor(max_workers=1) as checksummer:  # one worker: pieces in order
            pending = []
            for chunk in chunks:
                view = memoryview(chunk)
                for start in range(0, len(view), CHUNK):
                    piece = view[start : start + CHUNK]
                    pending.append(checksummer.submit(checksum, piece))
                    written = 0
                    while written < len(piece):
                        written += os.write(fd, piece[written:])
                size += len(view)
            for future in pending:
                future.result()
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"size": size, "crc32": running[0]}


@contextlib.contextmanager
def writing_lock(directory: Path, blocking: bool = True, *, rank: int | None = None):
    """Held by whoever writes into the folder; the kernel drops it when the holder dies, so a folder
    whose lock is free has no save in progress and whatever half-written thing is in it is litter.
    The ranks of one job each hold a lock of their own: their saves never wait for each other."""
    name = LOCK_FILE if rank is None else f".writing.{shard_name(rank)}.lock"
    fd = os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def write_checkpoint(
    directory: Path, step: int, tree: bytes, data: Iterable[memoryview | bytes], *, wall_time: float | None = None
) -> Path:
    """Write one complete checkpoint atomically; on any failure remove the partial one and raise."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with writing_lock(directory):
            return _write_locked(directory, step, tree, data, wall_time)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint step {step} in {directory}: {exc.strerror or exc}") from exc


def _write_locked(
    directory: Path, step: int, tree: bytes, data: Iterable[memoryview | bytes], wall_time: float | None
) -> Path:
    final = directory / checkpoint_name(step)
    tmp = directory / f"{TMP_PREFIX}{checkpoint_name(step)}-{os.getpid()}"
    _write_folder(directory, final, tmp, step, tree, data, wall_time, {})
    return final


def _write_folder(
    parent: Path,
    final: Path,
    tmp: Path,
    step: int,
    tree: bytes,
    data: Iterable[memoryview | bytes],
    wall_time: float | None,
    extra: dict[str, int],
) -> None:
    """Write the files in ``tmp``, fsync, rename it to ``final``, then write the manifest last."""
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = {DATA_FILE: _write_file(tmp / DATA_FILE, data), TREE_FILE: _write_file(tmp / TREE_FILE, [tree])}
        fsync_dir(tmp)
        if final.exists():  # the same step saved again (a resumed run): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(parent)
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "time": time.time() if wall_time is None else wall_time,
            "files": files,
            **extra,
        }
        _write_json(final / MANIFEST_FILE, manifest)
        fsync_dir(final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if final.exists() and not (final / MANIFEST_FILE).exists():
            shutil.rmtree(final, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CheckpointError(
                f"disk full writing checkpoint step {step} in {parent}; the previous checkpoints are kept"
            ) from exc
        raise CheckpointError(f"cannot write checkpoint step {step} in {parent}: {exc.strerror or exc}") from exc


def _write_json(path: Path, content: dict) -> None:
    """Through a temporary file, fsynced, renamed: a reader sees the whole file or none."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(content, out)
        out.flush()
        os.fsync(out.fileno())
    os.rename(tmp, path)


# ---------------------------------------------------------------------------------------------- shards
def write_shard(
    directory: Path,
    step: int,
    rank: int,
    world_size: int,
    tree: bytes,
    data: Iterable[memoryview | bytes],
    *,
    wall_time: float | None = None,
) -> Path:
    """Write this rank's shard of checkpoint ``step`` (atomically, manifest last), then the job file
    if every rank's shard is now in place. Returns the step folder."""
    step_dir = directory / checkpoint_name(step)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with writing_lock(directory, rank=rank):
            step_dir.mkdir(exist_ok=True)
            final = step_dir / shard_name(rank)
            if final.exists():  # this step saved again: the set is not complete until this shard is
                with contextlib.suppress(FileNotFoundError):
                    (step_dir / JOB_FILE).unlink()
            tmp = step_dir / f"{TMP_PREFIX}{shard_name(rank)}-{os.getpid()}"
            _write_folder(step_dir, final, tmp, step, tree, data, wall_time, {"rank": rank, "world_size": world_size})
        complete_job(step_dir, step, world_size)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint step {step} in {directory}: {exc.strerror or exc}") from exc
    return step_dir


def complete_job(step_dir: Path, step: int, world_size: int) -> bool:
    """Write ``job.json`` when every rank's shard of the step is whole; whether the step is complete.
    Every rank calls this after its own shard, so the last one to finish writes it."""
    if (step_dir / JOB_FILE).exists():
        return True
    shards = {}
    for rank in range(world_size):
        shard = step_dir / shard_name(rank)
        if quick_check(shard) is not None:
            return False
        manifest = read_manifest(shard)
        if manifest.world_size != world_size:
            return False
        shards[shard.name] = manifest.files
    _write_json(step_dir / JOB_FILE, {"format": FORMAT_VERSION, "step": step, "world_size": world_size,
                                      "time": time.time(), "shards": shards})  # fmt: skip
    with contextlib.suppress(OSError):
        fsync_dir(step_dir)
    return True


def complete_jobs(directory: Path) -> list[Path]:
    """Step folders of several ranks whose job file exists (every shard was in place), newest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if step_of(p) is not None and (p / JOB_FILE).exists()]
    return sorted(found, key=lambda p: step_of(p) or 0, reverse=True)


def invalidate_job(step_dir: Path) -> None:
    """A shard of a complete step turned out damaged: the step is no longer complete for any rank."""
    with contextlib.suppress(OSError):
        os.rename(step_dir / JOB_FILE, step_dir / f"damaged-{JOB_FILE}")


def clean_stale_shards(directory: Path, rank: int, *, dead_attempt: bool = True) -> list[Path]:
    """What this rank left behind: its temporary shard folders, its shards without a manifest, and
    (``dead_attempt``) its shards of steps newer than the newest complete one (written by an attempt
    that died: another rank's shard of a later attempt must never complete them). Called when the
    rank starts, before it trains: no shard of this rank is being written then. A running rank that
    replaces its writer passes ``dead_attempt=False``: its whole shards of incomplete steps are this
    attempt's own, waiting for the other ranks to complete the step."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    complete = complete_jobs(directory)
    newest = step_of(complete[0]) if complete else -1
    with writing_lock(directory, rank=rank):
        for step_dir in directory.iterdir():
            step = step_of(step_dir)
            if step is None or not step_dir.is_dir():
                continue
            for path in list(step_dir.iterdir()):
                tmp = _SHARD_TMP_NAME.match(path.name)
                unfinished = not (path / MANIFEST_FILE).exists()
                of_a_dead_attempt = dead_attempt and step > newest and not (step_dir / JOB_FILE).exists()
                if (tmp and int(tmp.group(1)) == rank) or (
                    path.name == shard_name(rank) and (unfinished or of_a_dead_attempt)
                ):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
    return removed


def prune_jobs(directory: Path, keep: int, protect: Path | None = None, rank: int | None = None) -> None:
    """Keep the ``keep`` newest complete steps of a job of several ranks; remove older steps, and
    steps older than the newest complete one that never completed (a rank died while saving them).
    Any rank may prune: removing a folder another rank removes at the same time is harmless.

    ``rank``: also remove that rank's shards of the steps after the newest complete one beyond the
    ``keep`` newest of them: steps the other ranks never saved (a job where only some ranks make a
    Checkpointer, ranks that numbered their steps differently) must not fill the disk."""
    complete = [p for p in complete_jobs(directory)]
    newest = (step_of(complete[0]) or 0) if complete else -1
    if complete:
        kept = {p.name for p in complete[:keep]} | ({protect.name} if protect is not None else set())
        for path in directory.iterdir():
            step = step_of(path)
            if step is None or path.name in kept or step >= newest:
                continue
            with contextlib.suppress(OSError):
                (path / JOB_FILE).unlink()  # first: a half-deleted step must never look complete
            shutil.rmtree(path, ignore_errors=True)
    if rank is None:
        return
    pending = sorted(
        (p for p in directory.iterdir() if (step := step_of(p)) is not None and step > newest
         and not (p / JOB_FILE).exists() and (p / shard_name(rank)).is_dir()),
        key=lambda p: step_of(p) or 0, reverse=True,
    )  # fmt: skip
    for path in pending[keep:]:
        if protect is not None and path.name == protect.name:
            continue
        shutil.rmtree(path / shard_name(rank), ignore_errors=True)
        with contextlib.suppress(OSError):
            path.rmdir()  # the last rank's shard gone: the step folder too


def damaged_folders(directory: Path) -> list[Path]:
    """Checkpoints moved aside as damaged (kept for a person to look at), oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _DAMAGED_NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_DAMAGED_NAME.match(p.name).group(1)))


def read_manifest(path: Path) -> Manifest:
    try:
        raw = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
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
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DamagedCheckpoint(f"{path.name}: unreadable manifest ({exc})") from exc
    if manifest.format > FORMAT_VERSION:
        raise DamagedCheckpoint(f"{path.name}: written by a newer trainguard (format {manifest.format})")
    expected = step_of(path) if _SHARD_NAME.match(path.name) is None else step_of(path.parent)
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


def clean_stale(directory: Path) -> list[Path]:
    """Remove what killed saves left behind: temporary folders, and renamed folders whose manifest was
    never written. While another process is saving into the folder, only the temporary folders of
    dead processes are touched. Returns what was removed."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    with writing_lock(directory, blocking=False) as nobody_writing:
        for path in directory.iterdir():
            tmp = _TMP_NAME.match(path.name)
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
        found = _DAMAGED_NAME.match(path.name)
        if found and int(found.group(1)) < 1000 * oldest_kept:
            shutil.rmtree(path, ignore_errors=True)
