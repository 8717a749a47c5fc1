"""A checkpoint of a job of several ranks (see ``_format``): each rank writes its own shard, and
``job.json``, written by whichever rank completes the set, makes the step complete for the job.
Here too: cleaning up after a dead attempt, invalidating a step found damaged, pruning steps, and
refusing a step saved by a job of another size."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from trainguard.checkpoint._atomic_write import fsync_dir, write_folder, write_json
from trainguard.checkpoint._format import (
    FORMAT_VERSION,
    JOB_FILE,
    MANIFEST_FILE,
    SHARD_TMP_NAME,
    TMP_PREFIX,
    CheckpointError,
    checkpoint_name,
    shard_name,
    step_of,
    writer_stamp,
    writing_lock,
)
from trainguard.checkpoint._verified_read import quick_check, read_json, read_manifest


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
            write_folder(step_dir, final, tmp, step, tree, data, wall_time, {"rank": rank, "world_size": world_size})
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
    write_json(step_dir / JOB_FILE, {"format": FORMAT_VERSION, "step": step, "world_size": world_size,
                                      "time": time.time(), "shards": shards, **writer_stamp()})  # fmt: skip
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
                tmp = SHARD_TMP_NAME.match(path.name)
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


def check_world_size(step_dir: Path, world_size: int) -> None:
    """Refuse to resume a job of ``world_size`` ranks from a step saved by a job of another size."""
    try:
        saved = read_json(step_dir / JOB_FILE).get("world_size")
    except (OSError, CheckpointError, AttributeError):
        return  # loading the shard reads its own manifest, and says what is wrong
    if saved != world_size:
        raise CheckpointError(
            f"{step_dir.name} was saved by {saved} ranks and this job has {world_size}: every rank needs its own "
            "shard (start the job with the same number of ranks)"
        )
