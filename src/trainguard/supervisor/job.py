"""What one attempt of a job is given: its command line, its environment, the checkpoint it resumes
from. Pure functions of data, except ``choose_resume``, ``find_resume`` and ``checkpoint_times`` which
look at the checkpoint folder (through ``trainguard.checkpoint.layouts``)."""

from __future__ import annotations

import glob
import os
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass

from trainguard.checkpoint import layouts


@dataclass(frozen=True)
class JobOptions:
    command: tuple[str, ...]
    cwd: str
    checkpoint_dir: str
    checkpoint_glob: str | None = None
    checkpoint_layout: str = "auto"
    resume_arg: str | None = None
    hang_timeout_s: float | None = None
    peer_timeout_s: float | None = 600.0  # a launcher's job across nodes: the wait for the other nodes
    grace_s: float = 120.0
    stop_signal: int = 15
    memory_limit: int | None = None
    sample_interval_s: float = 5.0
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"


def job_environment(
    base: Mapping[str, str],
    *,
    run_id: str,
    attempt: int,
    restart_cause: str | None,
    checkpoint_dir: str,
    resume_from: str | None,
    batch_scale: float,
    error_file: str,
    progress_file: str,
) -> dict[str, str]:
    env = dict(base)
    env.update(
        TRAINGUARD_RUN_ID=run_id,
        TRAINGUARD_ATTEMPT=str(attempt),
        TRAINGUARD_CHECKPOINT_DIR=checkpoint_dir,
        TRAINGUARD_BATCH_SCALE=f"{batch_scale:g}",
        TRAINGUARD_ERROR_FILE=error_file,
        TRAINGUARD_PROGRESS_FILE=progress_file,
    )
    for name, value in (("TRAINGUARD_RESTART_CAUSE", restart_cause), ("TRAINGUARD_RESUME_FROM", resume_from)):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    # The last lines before a kill must reach the log, and a native crash must leave a Python stack.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def job_argv(command: tuple[str, ...], resume_arg: str | None, resume_from: str | None) -> list[str]:
    """The command, with ``--resume-arg`` (e.g. "--resume {checkpoint}") appended when resuming."""
    argv = list(command)
    if resume_arg and resume_from:
        argv += [part.replace("{checkpoint}", resume_from) for part in shlex.split(resume_arg)]
    return argv


# The job waits at this gate, reading its stdin, until its supervisor has recorded it: a supervisor
# killed between starting a job and recording it leaves no job that nobody knows of (the gate reads
# end of file and the command never runs). Then stdin is /dev/null again, read-write as a detached
# job's was.
_GATE = 'IFS= read -r go && [ "$go" = go ] || exit 125; exec <>/dev/null; exec "$@"'
GATE_OPEN = b"go\n"


def gated_argv(argv: list[str]) -> list[str]:
    """``argv`` behind the start gate (a shell that becomes the command: its pid is the job's)."""
    return ["/bin/sh", "-c", _GATE, "trainguard-gate", *argv]


@dataclass(frozen=True)
class ResumeChoice:
    path: str | None  # the newest complete checkpoint, or None
    skipped: tuple[str, ...] = ()  # newer incomplete ones, "path: why" (reported, never deleted)


def choose_resume(
    checkpoint_dir: str, checkpoint_glob: str | None, layout: str = "auto", *, settle_s: float = 0.2
) -> ResumeChoice:
    """The newest complete checkpoint of the folder's layout (``--checkpoint-layout``), and the newer
    incomplete ones passed over; or with ``--checkpoint-glob`` the newest matching file whose size is
    not changing (still being written)."""
    if checkpoint_glob is None:
        found = layouts.scan(checkpoint_dir, layout)
        chosen = next((c for c in found if c.complete), None)
        newer = found[: found.index(chosen)] if chosen else found
        return ResumeChoice(chosen.path if chosen else None, tuple(c.describe() for c in newer if not c.complete))
    pattern = checkpoint_glob if os.path.isabs(checkpoint_glob) else os.path.join(checkpoint_dir, checkpoint_glob)
    candidates = sorted((p for p in glob.glob(pattern) if os.path.isfile(p)), key=os.path.getmtime, reverse=True)
    for path in candidates:
        try:
            size = os.path.getsize(path)
            time.sleep(settle_s)
            if os.path.getsize(path) == size and size > 0:
                return ResumeChoice(path)
        except OSError:
            continue
    return ResumeChoice(None)


def find_resume(
    checkpoint_dir: str, checkpoint_glob: str | None, *, layout: str = "auto", settle_s: float = 0.2
) -> str | None:
    """The path ``choose_resume`` picks."""
    if checkpoint_glob is None:
        newest = layouts.newest_complete(checkpoint_dir, layout)
        return newest.path if newest else None
    return choose_resume(checkpoint_dir, checkpoint_glob, layout, settle_s=settle_s).path


def checkpoint_times(
    checkpoint_dir: str, checkpoint_glob: str | None, *, layout: str = "auto", limit: int = 6
) -> list[float]:
    """When the newest ``limit`` complete checkpoints were written, newest first: those of the
    folder's layout, or with ``--checkpoint-glob`` the matching non-empty files."""
    if checkpoint_glob is None:
        times = [c.time for c in layouts.scan(checkpoint_dir, layout) if c.complete]
    else:
        pattern = checkpoint_glob if os.path.isabs(checkpoint_glob) else os.path.join(checkpoint_dir, checkpoint_glob)
        times = []
        for path in glob.glob(pattern):
            try:
                if os.path.isfile(path) and os.path.getsize(path) > 0:
                    times.append(os.path.getmtime(path))
            except OSError:  # removed by pruning meanwhile
                continue
    return sorted(times, reverse=True)[:limit]
