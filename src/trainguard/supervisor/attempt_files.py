"""The files of one attempt in its run's folder: their names, the ``output.log`` link that follows the
current attempt, and the marker lines the supervisor writes into an attempt's log."""

from __future__ import annotations

import contextlib
import glob
import os
from datetime import datetime
from pathlib import Path

from trainguard._i18n import Text, choose_language


def attempt_log_name(n: int) -> str:
    return f"attempt-{n}.log"


def error_file(run_dir: str, n: int) -> str:
    return os.path.join(run_dir, f"attempt-{n}.error.json")


def progress_file(run_dir: str, n: int) -> str:
    return os.path.join(run_dir, f"attempt-{n}.progress.json")


def launcher_error_file(run_dir: str | Path, n: int) -> str:
    return os.path.join(run_dir, f"attempt-{n}.launcher-error.json")


def save_request_file(run_dir: str, n: int) -> str:
    """Where the supervisor asks attempt ``n``'s job to save (``checkpoint.saverequest``)."""
    return os.path.join(run_dir, f"save-request-{n}.json")


def ranks_dir(run_dir: str, n: int) -> str:
    return os.path.join(run_dir, f"attempt-{n}.ranks")


def hang_stacks_file(run_dir: str, n: int) -> Path:
    return Path(run_dir) / f"hang-attempt-{n}.txt"


def stacks_dir(run_dir: str | Path, n: int) -> str:
    """Where the job's Python processes write their stacks on trainguard's signal, one file each
    (``PID.txt``): read into the hang stacks file when the attempt hangs."""
    return os.path.join(run_dir, f"attempt-{n}.stacks")


def rank_files_of(*paths: str) -> list[str]:
    """The per-rank copies of ``paths`` (``PATH.rankN``) that a launcher's workers wrote."""
    return [found for path in paths for found in glob.glob(glob.escape(path) + ".rank*")]


def point_output_log(link_path: str, target: str) -> None:
    """output.log is a symlink to the current attempt's log (`tail -F output.log` follows restarts)."""
    link = Path(link_path)
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(target)
        os.replace(tmp, link)


def append_marker(log_file: str | None, text: Text) -> None:
    """A line in the attempt's own log, after the job is gone (a person following the file with
    `tail -F` sees why it ended), in the language of the person who started the run. Best effort: a
    full disk loses the line, not the supervision."""
    if log_file is None:
        return
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError):
        fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)  # never recreate a removed log
        with os.fdopen(fd, "a", encoding="utf-8") as log:
            log.write(f"==== trainguard {stamp} · {text.pick(choose_language(None, os.environ))} ====\n")
