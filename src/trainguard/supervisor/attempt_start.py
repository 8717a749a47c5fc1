"""Starting one attempt's job: the checkpoint it resumes from, its files in the run's folder (those an
earlier try left removed), its environment, where a launcher's ranks write theirs, its log, its
cgroups, and the job itself, waiting behind the start gate until its supervisor has recorded it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard._proc import ProcessRef, start_time
from trainguard.checkpoint.resume import ResumeChoice, choose_resume
from trainguard.probes import kernel_log
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt, Run
from trainguard.supervisor import checkpoint_folders, launchers, run_environment
from trainguard.supervisor.attempt_files import (
    attempt_log_name,
    error_file,
    launcher_error_file,
    point_output_log,
    progress_file,
    rank_files_of,
    ranks_dir,
    save_request_file,
    stacks_dir,
)
from trainguard.supervisor.containment import Containment, contain
from trainguard.supervisor.failure_history import machine_mtbf
from trainguard.supervisor.job import GATE_OPEN, JobOptions, gated_argv, job_argv, job_environment


@dataclass
class PreparedAttempt:
    """An attempt ready to start: its command behind the gate, its environment, its open log."""

    n: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    resume: ResumeChoice
    log_file: str
    log_fd: int  # the job's stdout and stderr
    read_fd: int  # the supervisor's own, kept for the whole attempt
    containment: Containment
    kernel_tail: kernel_log.KernelTail
    launch_record: dict[str, Any] | None
    started_wall: float = field(default=0.0, init=False)  # when the job was started, wall time
    _gate_write: int | None = field(default=None, init=False)  # the supervisor's end of the start gate

    def spawn(self) -> subprocess.Popen:
        """The job, started in its own session, waiting at its gate."""
        gate_read, self._gate_write = os.pipe2(os.O_CLOEXEC)
        self.started_wall = time.time()
        try:
            # In its own session: no terminal's SIGHUP reaches it.
            return subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=gate_read, stdout=self.log_fd,
                                    stderr=self.log_fd, start_new_session=True)  # fmt: skip
        except OSError:
            os.close(self.read_fd)
            self.close_gate()
            self.containment.remove()
            self.kernel_tail.close()
            raise
        finally:
            os.close(self.log_fd)
            os.close(gate_read)

    def record_of(self, process: subprocess.Popen) -> Attempt:
        """The attempt's record, once its job has started: the job is now the containment's."""
        job = ProcessRef(process.pid, start_time(process.pid))
        self.containment.job = job
        return Attempt(
            n=self.n,
            started_at=self.started_wall,
            pid=process.pid,
            pid_start=job.start,
            resumed_from=self.resume.path,
            log_path=self.log_file,
            containment=self.containment.to_record(),
            skipped=list(self.resume.skipped) or None,
        )

    def open_gate(self) -> None:
        with contextlib.suppress(OSError):  # a gate nobody reads: the job died already, it is watched
            os.write(self._gate_write, GATE_OPEN)

    def close_gate(self) -> None:
        """Without the gate opened first, the job reads end of file there and never runs."""
        if self._gate_write is not None:
            os.close(self._gate_write)
            self._gate_write = None


def prepare_attempt(
    journal: Journal,
    options: JobOptions,
    n: int,
    *,
    restart_cause: str | None,
    batch_scale: float,
    subreaper: bool,
) -> PreparedAttempt:
    run = journal.run
    run_dir = Path(run.run_dir)
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    choice = choose_resume(options.checkpoint_dir, options.checkpoint_glob, options.checkpoint_layout,
                           other_runs=checkpoint_folders.other_runs(journal.registry, run))  # fmt: skip
    Path(options.checkpoint_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    if choice.skipped:  # incomplete ones are reported, never chosen, never deleted
        journal.event("checkpoints_skipped", {"attempt": n, "skipped": list(choice.skipped)})
    errors, progress = error_file(run.run_dir, n), progress_file(run.run_dir, n)
    launcher_errors, requests = launcher_error_file(run_dir, n), save_request_file(run.run_dir, n)
    for stale in (errors, progress, launcher_errors, requests, *rank_files_of(errors, progress)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stale)
    env = job_environment(
        run_environment.job_base(run.run_dir),
        run_id=run.id,
        attempt=n,
        restart_cause=restart_cause,
        checkpoint_dir=options.checkpoint_dir,
        resume_from=choice.path,
        batch_scale=batch_scale,
        error_file=errors,
        progress_file=progress,
        stacks_dir=stacks_dir(run.run_dir, n),
        save_request_file=requests,
        mtbf_s=machine_mtbf(journal.registry, run.host, time.time()).seconds,
    )
    launch_record = _prepare_launcher(run, options, env, n, launcher_errors)
    log_file = str(run_dir / attempt_log_name(n))
    # A fresh file per attempt: appending to one that already holds data is measurably slower.
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
    read_fd = os.open(log_file, os.O_RDONLY | os.O_CLOEXEC)
    if choice.folder_missing and n > 1:
        checkpoint_folders.say_it_starts_fresh(journal, n, options.checkpoint_dir, log_file)
    point_output_log(run.log_path, attempt_log_name(n))
    containment = contain(f"trainguard-{run.id}-{n}", options.memory_limit, subreaper=subreaper)
    kernel_tail = kernel_log.KernelTail()  # opened before the job starts: none of its records are missed
    argv = gated_argv(containment.join_argv(job_argv(options.command, options.resume_arg, choice.path)))
    return PreparedAttempt(n=n, argv=argv, cwd=options.cwd, env=env, resume=choice, log_file=log_file, log_fd=log_fd,
                           read_fd=read_fd, containment=containment, kernel_tail=kernel_tail,
                           launch_record=launch_record)  # fmt: skip


def _prepare_launcher(
    run: Run, options: JobOptions, env: dict[str, str], n: int, launcher_errors: str
) -> dict[str, Any] | None:
    """A launcher's job (torchrun, DeepSpeed, Accelerate): its ranks' files go to the attempt's
    folder through the launcher's environment, and the record of where they are is written."""
    launcher = launchers.recognise(options.command)
    if launcher is None:
        return None
    env.update(launchers.environment(launcher, env, ranks_dir=ranks_dir(run.run_dir, n), error_file=launcher_errors))
    record = {
        "launcher": launcher.kind,
        "multi_node": launcher.multi_node(env),
        "log_dirs": launchers.log_dirs(launcher, env),
        "launcher_error_file": env.get("TORCHELASTIC_ERROR_FILE"),
        "host": socket.gethostname(),
        "workers": {},
        "hung_ranks": [],
    }
    launchers.write_record(launchers.record_path(run.run_dir, n), record)
    return record
