"""What one attempt of a job is given: its options, its command line (behind the start gate) and its
environment (with trainguard's start-up hook first on its PYTHONPATH). Pure functions of data; which
checkpoint it resumes from is ``trainguard.checkpoint.resume``'s to say."""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The folder of the job's start-up hook (_jobsite/sitecustomize.py): it arms faulthandler in every
# Python process of the job on STACKS_SIGNAL, so a hang dump needs neither py-spy nor ptrace rights.
JOB_SITE_DIR = str(Path(__file__).resolve().parent.parent / "_jobsite")
# A real-time signal of trainguard's own: SIGUSR1 is the save request, SIGUSR2 is taken by some
# frameworks, and glibc keeps the first real-time signals (SIGRTMIN is already past them).
STACKS_SIGNAL = signal.SIGRTMIN + 5


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

    @classmethod
    def of_record(cls, command: list[str] | tuple[str, ...], cwd: str, o: Mapping[str, Any]) -> JobOptions:
        """The options a run's record holds (``Run.command``, ``Run.cwd``, ``Run.options``)."""
        return cls(
            command=tuple(command),
            cwd=cwd,
            checkpoint_dir=o["checkpoint_dir"],
            checkpoint_glob=o.get("checkpoint_glob"),
            checkpoint_layout=o.get("checkpoint_layout", "auto"),
            resume_arg=o.get("resume_arg"),
            hang_timeout_s=o.get("hang_timeout_s"),
            peer_timeout_s=o.get("peer_timeout_s", 600.0),
            grace_s=o.get("grace_s", 120.0),
            stop_signal=o.get("stop_signal", 15),
            memory_limit=o.get("memory_limit"),
            sample_interval_s=o.get("sample_interval_s", 5.0),
            metrics_port=o.get("metrics_port"),
            metrics_bind=o.get("metrics_bind", "127.0.0.1"),
        )


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
    stacks_dir: str | None = None,
    save_request_file: str | None = None,
    mtbf_s: float | None = None,
) -> dict[str, str]:
    """The job's environment: ``base`` with trainguard's variables. With ``stacks_dir`` (where the
    job's Python processes write their stacks on STACKS_SIGNAL) the start-up hook's folder goes first
    on PYTHONPATH, the user's own entries after it. ``save_request_file`` is where the supervisor
    asks the job to save ahead of a death it sees coming; ``mtbf_s`` the mean time between failures
    that ``every="auto"`` plans for (from the run's and the machine's history)."""
    env = dict(base)
    env.update(
        TRAINGUARD_RUN_ID=run_id,
        TRAINGUARD_ATTEMPT=str(attempt),
        TRAINGUARD_CHECKPOINT_DIR=checkpoint_dir,
        TRAINGUARD_BATCH_SCALE=f"{batch_scale:g}",
        TRAINGUARD_ERROR_FILE=error_file,
        TRAINGUARD_PROGRESS_FILE=progress_file,
    )
    for name, value in (
        ("TRAINGUARD_RESTART_CAUSE", restart_cause),
        ("TRAINGUARD_RESUME_FROM", resume_from),
        ("TRAINGUARD_STACKS_DIR", stacks_dir or None),
        ("TRAINGUARD_STACKS_SIGNAL", str(STACKS_SIGNAL) if stacks_dir else None),
        ("TRAINGUARD_SAVE_REQUEST_FILE", save_request_file),
        ("TRAINGUARD_MTBF_S", f"{mtbf_s:.0f}" if mtbf_s is not None else None),
    ):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    # The last lines before a kill must reach the log, and a native crash must leave a Python stack.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    if stacks_dir:
        env["PYTHONPATH"] = _with_job_site(env.get("PYTHONPATH", ""))
    return env


def _with_job_site(pythonpath: str) -> str:
    """``pythonpath`` with the hook's folder first (once). No empty entry is added: Python reads one
    as the working folder."""
    entries = [entry for entry in pythonpath.split(os.pathsep) if entry != JOB_SITE_DIR] if pythonpath else []
    return os.pathsep.join([JOB_SITE_DIR, *entries])


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
