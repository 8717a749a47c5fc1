"""One checkpoint folder, one live run. Two trainguard runs of one script in one working folder
(`Checkpointer("ckpt")`, a relative path) would resume from each other's checkpoints, prune each
other's saves and clean each other's save in flight as "stale": the second one's Checkpointer is
refused at once, saying which run holds the folder.

Each process of a run holds a shared flock on ``.live-RUN`` in the folder for as long as its
Checkpointer is open (its ranks, its DataLoader workers and a second Checkpointer of the same job
share it); another run's file that cannot be locked exclusively is held by a live run. A folder on
a filesystem without flock (some NFS) is not checked. Outside trainguard (no run id), and for a
job of several ranks, nothing is claimed: the nodes of one job share their folder, each under a run
of its own node, and nothing local tells them from two jobs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from pathlib import Path

from trainguard.checkpoint._format import CheckpointError

CLAIM_PREFIX = ".live-"
_RUN_ID = re.compile(r"[0-9a-f]{8}")  # the registry's run ids
CLAIM_NAME = re.compile(rf"^{re.escape(CLAIM_PREFIX)}(?P<run>{_RUN_ID.pattern})$")


class FolderInUse(CheckpointError):
    """Another live trainguard run's job checkpoints into this folder."""


def claim(folder: Path, run_id: str | None) -> int | None:
    """Claim ``folder`` for ``run_id``: the descriptor that holds the claim (closing it lets go), or
    None where nothing is claimed. Raises FolderInUse."""
    if not run_id or not _RUN_ID.fullmatch(run_id):
        return None
    try:
        fd = os.open(folder / f"{CLAIM_PREFIX}{run_id}", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError:
        return None  # a read-only folder, a link planted there: loading still works, nothing to claim
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None  # no flock here (some NFS), or a run of this id checks it right now
    holder = _live_other(folder, run_id)
    if holder is not None:
        release(fd, folder, run_id)
        raise FolderInUse(
            f"{folder.resolve()} is the checkpoint folder of run {holder}, which is running: two runs in one folder "
            "resume from and prune each other's checkpoints; give this one its own "
            "(TRAINGUARD_CHECKPOINT_DIR, or a folder named after the run)"
        )
    return fd


def _live_other(folder: Path, run_id: str) -> str | None:
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            match = CLAIM_NAME.match(entry.name)
            if not match or match["run"] == run_id:
                continue
            if _held(Path(entry.path)):
                return match["run"]
            with contextlib.suppress(OSError):
                os.unlink(entry.path)  # a run that ended (or died) left it
    return None


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def release(fd: int | None, folder: Path, run_id: str | None) -> None:
    """Let go of the claim; the last process of the run to let go removes its file."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while another process of the run holds it
        os.unlink(folder / f"{CLAIM_PREFIX}{run_id}")
    with contextlib.suppress(OSError):
        os.close(fd)
