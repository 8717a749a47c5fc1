"""Runs a training script with one of its saves made slow, so a test can SIGKILL the job while the
checkpoint is half written (a slow disk, stood in for by a pause in the middle of one file).

    python slow_save.py SCRIPT ARGS...      with TG_TEST_SLOW_SAVE=<regex of the file's path>
                                            and TG_TEST_SLOW_MARKER=<file touched once it pauses>

Only in the first attempt (TRAINGUARD_ATTEMPT=1), only the first matching file: half of it is
written, the marker is touched, and the process sleeps until it is killed. Files written by
``torch.save`` are matched by path, and so are copies made by ``os.sendfile`` (``shutil.move``
across filesystems, which is how fsspec, and so Lightning, puts a checkpoint in place when the
temporary folder is on another filesystem).
"""

from __future__ import annotations

import io
import os
import re
import runpy
import sys
import time
from pathlib import Path

PATTERN = re.compile(os.environ["TG_TEST_SLOW_SAVE"])
MARKER = Path(os.environ["TG_TEST_SLOW_MARKER"])
ARMED = os.environ.get("TRAINGUARD_ATTEMPT", "1") == "1"


def _pause(path: str) -> None:
    MARKER.write_text(path)
    print(f"slow_save: paused half way through {path}", flush=True)
    while True:
        time.sleep(60)


def _patch_torch_save() -> None:
    import torch

    real = torch.save

    def save(obj, f, *args, **kwargs):
        path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
        if path is None or not PATTERN.search(path) or MARKER.exists():
            return real(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        with open(path, "wb") as out:
            out.write(data[: len(data) // 2])
        _pause(path)

    torch.save = save


def _patch_sendfile() -> None:
    real = os.sendfile

    def sendfile(out_fd, in_fd, offset, count, *args, **kwargs):
        try:
            path = os.readlink(f"/proc/self/fd/{out_fd}")
        except OSError:
            path = ""
        if not PATTERN.search(path) or MARKER.exists():
            return real(out_fd, in_fd, offset, count, *args, **kwargs)
        size = os.fstat(in_fd).st_size
        real(out_fd, in_fd, offset, max(1, size // 2))
        _pause(path)

    os.sendfile = sendfile


if ARMED:
    _patch_torch_save()
    _patch_sendfile()
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
