"""Runs that no supervisor watches: who holds a run's lock, stopping a run whose supervisor is gone
as that supervisor would, and what a start that failed leaves behind (a run record, a run marked
starting again, a job started but never recorded)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

from trainguard import progress
from trainguard._i18n import Text
from trainguard._proc import ProcessRef
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt, Registry, Run
from trainguard.store.states import TERMINAL_STATES, RunState
from trainguard.supervisor import lock as run_lock
from trainguard.supervisor.attempt_files import progress_file
from trainguard.supervisor.containment import KILL_TIMEOUT_S, Containment, stop_gracefully
from trainguard.supervisor.job import JobOptions
from trainguard.supervisor.progress_tracking import ProgressTracker


def undo_continue_if_never_started(registry: Registry, before: Run) -> None:
    """After a continuation that failed to start: the run ends as it was (marked starting by
    ``prepare_continue``), unless an attempt was recorded or a supervisor holds it now; a job started
    but not recorded goes first (see ``forget_if_never_started``)."""
    run = registry.get(before.id)
    if run is None or len(run.attempts) > len(before.attempts) or watched_by(run) is not None:
        return
    if RunState(run.state) in TERMINAL_STATES:  # a stop ended it before its attempt
        return
    _kill_unrecorded_jobs(run.id)
    registry.set_state(run.id, before.state, reason=Text("it could not be continued", "无法继续运行"))


def forget_if_never_started(registry: Registry, run_id: str) -> None:
    """After a start that failed: the run's record and folder go, unless an attempt was recorded or a
    supervisor holds it now (one that answered too late is still watching its job). A job its
    supervisor started but did not live to record (killed between the two) goes first: nobody was
    told of it, and nothing could stop it once its record is gone."""
    run = registry.get(run_id)
    if run is None or run.attempts or watched_by(run) is not None:
        return
    _kill_unrecorded_jobs(run_id)
    registry.delete_run(run_id)


def _processes_of_run(run_id: str) -> list[psutil.Process]:
    """Every process started for the run, recorded or not: each job and its children carry
    TRAINGUARD_RUN_ID."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # this command, if the job ran it, is spared
            if process.pid != os.getpid() and process.environ().get("TRAINGUARD_RUN_ID") == run_id:
                found.append(process)
    return found


def _kill_unrecorded_jobs(run_id: str) -> None:
    """Kill what was started for a run whose start failed before an attempt was recorded (a run's
    earlier attempts have all ended by then)."""
    _stop_unrecorded(run_id, signal.SIGKILL, grace_s=0)


def _stop_unrecorded(run_id: str, stop_signal: int, grace_s: float) -> int:
    """Stop what is left of a run once its recorded job is gone: a job its supervisor started while
    the registry could not be written and did not live to record. The stop signal, the grace period,
    then SIGKILL; how many processes there were."""
    found = _processes_of_run(run_id)
    for process in found:
        with contextlib.suppress(psutil.Error):
            process.send_signal(stop_signal)
    left = _wait_gone(found, grace_s)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    _wait_gone(left, KILL_TIMEOUT_S)
    return len(found)


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each has ended (a zombie has: its parent may never reap it); those still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in processes if ProcessRef(p.pid, None).alive() and p.is_running()]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def watched_by(run: Run) -> ProcessRef | None:
    """The supervisor holding the run's lock, or None."""
    return run_lock.holder(run.run_dir)


def unwatched(run: Run) -> bool:
    """An active run whose supervisor is gone (killed, OOM-killed itself, the machine tool crashed)."""
    return RunState(run.state) not in TERMINAL_STATES and watched_by(run) is None


def _record_what_it_saved(registry: Registry, run: Run, attempt: Attempt) -> None:
    """What the ended job reported (its steps, a stop it obeyed) and the checkpoints it saved since
    its supervisor died, recorded as the supervisor records them at an attempt's end: without them
    its goodput counted none of that work (0 % after a stop that saved)."""
    attempt.progress = progress.read(progress_file(run.run_dir, attempt.n)) or attempt.progress
    with contextlib.suppress(KeyError, OSError):  # the stop is recorded all the same
        tracker = ProgressTracker(Journal(registry, run), run, JobOptions.of_record(run.command, run.cwd, run.options))
        tracker.recall_recorded_checkpoints()
        tracker.learn_checkpoint_dir(attempt.progress or {})
        tracker.record_checkpoints(attempt, attempt.progress or {}, scan=True)


def stop_unwatched(registry: Registry, run: Run, grace_s: float) -> Text:
    """Stop a run that has no supervisor, as its supervisor would: the stop signal to the job's group,
    the grace period, then SIGKILL to everything left. Returns what really happened."""
    held = run_lock.SupervisorLock.acquire(run.run_dir, run.id)
    try:
        run = registry.get(run.id) or run
        if RunState(run.state) in TERMINAL_STATES:
            return Text(f"it had already ended ({run.state})", f"它已经结束（{run.state}）")
        last = run.attempts[-1] if run.attempts and run.attempts[-1].ended_at is None else None
        job = ProcessRef(last.pid, last.pid_start) if last and last.pid else None
        containment = Containment.from_record(last.containment if last else None, job)
        if job is None or (not job.alive() and not containment.pids()):
            what = Text("nothing was running: the job had already ended unwatched",
                        "没有在运行的进程：作业已在无人监督时结束")  # fmt: skip
        else:
            stop_signal = int(run.options.get("stop_signal", 15))
            started = time.monotonic()
            in_time = stop_gracefully(containment, stop_signal, grace_s, job_exited=lambda: not job.alive())
            took = time.monotonic() - started
            what = (
                Text(f"the job ended {took:.1f} s after the stop signal", f"作业在停止信号后 {took:.1f} 秒结束")
                if in_time
                else Text(f"the job did not end within the {grace_s:g} s grace period and was killed",
                          f"作业在 {grace_s:g} 秒宽限期内没有结束，已被强制杀死")
            )
        containment.remove()
        unrecorded = _stop_unrecorded(run.id, int(run.options.get("stop_signal", 15)), grace_s)
        if unrecorded:
            what = Text(f"{what.en}; {unrecorded} process(es) of the run that its record did not know were stopped",
                        f"{what.zh}；另有 {unrecorded} 个记录中没有的该运行进程已被停止")  # fmt: skip
        if last is not None:
            last.ended_at = time.time()
            _record_what_it_saved(registry, run, last)
            registry.end_attempt(run.id, last)
        reason = Text(f"stopped on request without a supervisor: {what.en}", f"在没有监督进程时按请求停止：{what.zh}")
        registry.set_state(run.id, RunState.STOPPED.value, reason=reason)
        return what
    finally:
        held.release()
