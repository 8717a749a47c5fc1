"""Writing one checkpoint folder atomically (see ``_format``): its files written and fsynced in a
temporary folder, the folder renamed into place and fsynced, and only then the manifest, through a
temporary file, fsynced and renamed. A kill at any moment leaves no folder a reader would trust."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainguard.checkpoint._format import (
    CHUNK,
    DATA_FILE,
    FORMAT_VERSION,
    MANIFEST_FILE,
    TMP_PREFIX,
    TREE_FILE,
    CheckpointError,
    checkpoint_name,
    writer_stamp,
    writing_lock,
)


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
    write_folder(directory, final, tmp, step, tree, data, wall_time, {})
    return final


def write_folder(
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
            **writer_stamp(),
            **extra,
        }
        write_json(final / MANIFEST_FILE, manifest)
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


def write_json(path: Path, content: dict) -> None:
    """Through a temporary file, fsynced, renamed: a reader sees the whole file or none."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(content, out)
        out.flush()
        os.fsync(out.fileno())
    os.rename(tmp, path)
