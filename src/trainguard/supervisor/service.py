"""Starting and ending supervision, as the commands use it: a new run and its lock, an ended run
continued in place, and a run supervised in this process until its verdict. The checks before a
run exists (``preflight``), its supervisor's detached start (``detached``), its job's recorded
environment (``run_environment``) and what is done to a run that no supervisor watches
(``unwatched_runs``) live in modules of their own; the commands call them through this module.

Every path that acts on a run's job holds the run's supervisor lock first, so two of them never act
on one job at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainguard import causes
from trainguard._i18n import Text
from trainguard.causes import Retry
from trainguard.errors import TrainguardError, UsageError
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, Run
from trainguard.store.states import TERMINAL_STATES, RunState
from trainguard.supervisor import checkpoint_folders, run_environment
from trainguard.supervisor import lock as run_lock
from trainguard.supervisor.detached import Handshake, start_detached
from trainguard.supervisor.job import JobOptions
from trainguard.supervisor.policy import RestartPolicy, verdict_exit_code
from trainguard.supervisor.preflight import (
    check_checkpoint_dir,
    check_command,
    check_continued_checkpoint_dir,
    check_cwd,
    check_memory_limit,
    options_record,
    parse_retry_overrides,
)
from trainguard.supervisor.run_environment import parse_env_changes
from trainguard.supervisor.runner import Supervisor
from trainguard.supervisor.unwatched_runs import (
    forget_if_never_started,
    stop_unwatched,
    undo_continue_if_never_started,
    watched_by,
)

__all__ = [
    "Handshake",
    "check_checkpoint_dir",
    "check_command",
    "check_continued_checkpoint_dir",
    "check_cwd",
    "check_memory_limit",
    "continued_environment",
    "create_run",
    "forget_if_never_started",
    "job_options",
    "options_record",
    "parse_env_changes",
    "parse_retry_overrides",
    "prepare_continue",
    "start_detached",
    "stop_unwatched",
    "supervise_run",
    "undo_continue_if_never_started",
    "watched_by",
]


def create_run(
    command: list[str], *, name: str | None, options: dict[str, Any]
) -> tuple[Registry, Run, run_lock.SupervisorLock]:
    """A new run, and its supervisor lock: taken before any other command can see the run, so that
    none takes a run still starting for one whose supervisor died (`run --name`, `adopt`, `stop`).
    The caller hands the lock to the supervisor (``supervise_run``, ``start_detached``). This
    process's environment is the job's, for every attempt (``run_environment``)."""
    registry = Registry(state_dir())
    held: list[run_lock.SupervisorLock] = []

    def hold(run_id: str, run_dir: Path) -> None:
        if "checkpoint_dir" in options:  # chosen by the person: checked again where no other `run` can pass too
            checkpoint_folders.refuse_if_held(registry, options["checkpoint_dir"])
        held.append(run_lock.SupervisorLock.acquire(run_dir, run_id, patience_s=0))
        options.setdefault("checkpoint_dir", str(run_dir / "checkpoints"))  # in the record from its first moment
        run_environment.record(run_dir, os.environ)

    try:
        run = registry.create_run(command, name=name, cwd=os.getcwd(), options=options, before_visible=hold)
    except BaseException:
        for lock in held:
            lock.release()
        raise
    return registry, run, held[0]


def job_options(run: Run) -> JobOptions:
    return JobOptions.of_record(run.command, run.cwd, run.options)


def _policy(run: Run) -> RestartPolicy:
    o = run.options
    return RestartPolicy(
        mode=o.get("restart", "on-failure"),
        max_restarts=o.get("max_restarts", 10),
        retry_overrides={cause: Retry(value) for cause, value in o.get("retry", {}).items()},
        requeue=bool(o.get("requeue", False)),
    )


def supervise_run(
    run_id: str,
    *,
    registry: Registry | None = None,
    adopt: bool = False,
    restart: bool = False,
    handshake_fd: int | None = None,
    on_started: Callable[[Run], None] | None = None,
    lock: run_lock.SupervisorLock | None = None,
    handed_lock: tuple[int, float] | None = None,
) -> int:
    """Supervise a run until it ends; the exit status is the run's verdict (DESIGN section 5).
    ``lock``: the run's supervisor lock, already held here; ``handed_lock``: its descriptor and the
    time it was taken, handed to this process by the command that created the run."""
    handshake = Handshake(handshake_fd)
    prepared = lock is not None or handed_lock is not None
    try:
        registry = registry or Registry(state_dir())
        run = registry.get(run_id)
        if run is None:
            raise UsageError(f"no run {run_id}", f"没有运行 {run_id}")
        if lock is None and handed_lock is not None:
            lock = run_lock.SupervisorLock.inherit(handed_lock[0], run.run_dir, handed_lock[1])
        lock = lock or run_lock.SupervisorLock.acquire(run.run_dir, run.id)
        run = registry.get(run_id)  # read again under the lock: another supervisor may have changed it
        state = RunState(run.state)
        if adopt and state in TERMINAL_STATES:
            raise UsageError(f"run {run.id} has ended ({run.state})", f"运行 {run.id} 已结束（{run.state}）")
        if restart and not prepared:  # else the command that handed over the lock marked it starting
            if state not in TERMINAL_STATES:
                raise UsageError(f"run {run.id} is still {run.state}", f"运行 {run.id} 仍在{run.state}")
            registry.set_state(run.id, RunState.STARTING.value, reason=Text("continued in place", "原地继续"),
                               data={"restart": True})  # fmt: skip
            run.state = RunState.STARTING.value
        supervisor = Supervisor(registry, run, job_options(run), _policy(run), lock=lock)
        supervisor.install_signal_handlers()

        def started(current: Run) -> None:
            handshake.started(current)
            if on_started is not None:
                on_started(current)

        final = supervisor.supervise(adopt=adopt, on_started=started)
        supervisor.write_what_is_left()
    except TrainguardError as exc:
        if not handshake.pending and handshake_fd is not None:
            raise
        handshake.failed(exc)
        if handshake_fd is None:
            raise
        return exc.exit_code
    except OSError as exc:
        error = UsageError(f"cannot start the job: {exc.strerror or exc}", f"无法启动作业：{exc.strerror or exc}")
        handshake.failed(error)
        if handshake_fd is None:
            raise error from exc
        return error.exit_code
    finally:
        if lock is not None:
            lock.release()
    last = supervisor.run.attempts[-1].cause if supervisor.run.attempts else None
    return verdict_exit_code(
        final.value, last, causes.catalogue(), stopped_from_outside=supervisor.stopped_from_outside
    )


def continued_environment(
    run: Run, caller: Mapping[str, str], changes: Mapping[str, str | None]
) -> tuple[dict[str, str], bool]:
    """The environment ``run``'s job continues with (``run_environment.continued``), and whether the
    run had one recorded: one recorded by an older trainguard continues with ``caller``'s."""
    recorded = run_environment.recorded(run.run_dir)
    environment = run_environment.continued(caller if recorded is None else recorded, caller, changes)
    return environment, recorded is not None


def prepare_continue(
    registry: Registry, run_id: str, *, environment: Mapping[str, str] | None = None, **changes: Any
) -> run_lock.SupervisorLock:
    """Take an ended run's lock and mark it starting again (with ``changes`` to its command, cwd,
    options, and ``environment``, its job's from now on), for the supervisor that continues it in
    place: a `stop` from now on is its business."""
    run = registry.get(run_id)
    if run is None:
        raise UsageError(f"no run {run_id}", f"没有运行 {run_id}")
    lock = run_lock.SupervisorLock.acquire(run.run_dir, run.id)
    try:
        run = registry.get(run_id)
        if RunState(run.state) not in TERMINAL_STATES:
            raise UsageError(f"run {run.id} is still {run.state}", f"运行 {run.id} 仍在{run.state}")
        if environment is not None:
            run_environment.record(run.run_dir, environment)
        if changes:
            registry.update_run(run.id, **changes)
        registry.set_state(run.id, RunState.STARTING.value, reason=Text("continued in place", "原地继续"),
                           data={"restart": True})  # fmt: skip
    except BaseException:
        lock.release()
        raise
    return lock
