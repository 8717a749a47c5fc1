"""The supervisor: runs a job attempt after attempt, names each death, restarts by policy, resumes.

The job runs in its own session and its own cgroups, with its output going straight into a log file
of the attempt's own (no pipe), so neither a closed terminal nor the supervisor's death can take it
down, and nothing it started outlives the attempt. The supervisor's record of the run lives in
memory first (``Journal``): a full or removed state disk does not stop supervision. Signal handlers
only record; the loop acts on them.

Every change of the run's state is made here (``Supervisor._transition``); the parts it owns do the
rest: starting an attempt (``attempt_start``), watching its job (``watch``), tracking its progress
and checkpoints (``progress_tracking``), naming its death (``death``), the run's monitor and
exporter (``monitoring``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from trainguard import causes, progress
from trainguard._i18n import Text
from trainguard._proc import start_time
from trainguard.diagnosis.evidence import ExitStatus
from trainguard.monitor.notify import from_record
from trainguard.postmortem import default_scanner
from trainguard.probes import oom_counters
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt, Registry, Run
from trainguard.store.states import RunState, check_transition
from trainguard.supervisor.attempt_files import append_marker, progress_file
from trainguard.supervisor.attempt_start import prepare_attempt
from trainguard.supervisor.containment import become_subreaper
from trainguard.supervisor.death import count_lines, name_the_death
from trainguard.supervisor.foresight import foresight_for
from trainguard.supervisor.job import JobOptions
from trainguard.supervisor.lock import AlreadyWatched, SupervisorLock
from trainguard.supervisor.log_keeper import RunLogs
from trainguard.supervisor.monitoring import start_monitoring
from trainguard.supervisor.policy import Decision, Outcome, RestartPolicy, decide, stopped_reason
from trainguard.supervisor.progress_tracking import ProgressTracker
from trainguard.supervisor.signals import SignalInbox
from trainguard.supervisor.watch import EXIT_UNKNOWN, POLL_S, AttemptWatch, JobWatch, WatchEnd


class Supervisor:
    def __init__(
        self,
        registry: Registry,
        run: Run,
        options: JobOptions,
        policy: RestartPolicy,
        *,
        lock: SupervisorLock | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.journal = Journal(registry, run, clock=clock)
        self.run = run
        self.tracker = ProgressTracker(self.journal, run, options)
        self.policy = policy
        self.lock = lock
        self.clock = clock
        self.sleep = sleep
        self.state = RunState(run.state)
        self.signals = SignalInbox()
        self.history: list[Outcome] = []
        self.batch_scale = 1.0
        self.notifiers = from_record(run.options.get("notify", []))
        self._on_started: Callable[[Run], None] | None = None
        self.subreaper = False
        # A stop signal that `trainguard stop` did not announce came from a scheduler or a container
        # runtime: under `run --foreground` that is a preemption (exit 75), not a person's stop.
        self.stopped_from_outside = False

    @property
    def options(self) -> JobOptions:
        """The job's options, with the checkpoint folder it really uses (the tracker learns it)."""
        return self.tracker.options

    # ------------------------------------------------------------------ signals
    def install_signal_handlers(self) -> None:
        self.signals.install()

    def write_what_is_left(self) -> None:
        """The run has ended: the records the registry could not take (a full state disk) are the
        only account of how, so this process stays until they are written. One stop signal during
        the wait is a `trainguard stop` that has nothing left to stop; a second one gives up."""
        signals_before = self.signals.stop_signals
        self.journal.drain(give_up=lambda: self.signals.stop_signals >= signals_before + 2, sleep=self.sleep)

    def _stop_request(self) -> dict | None:
        """What `trainguard stop` recorded for the stop being acted on. None: the stop signal came
        from outside trainguard, as is noted for the verdict."""
        request = self.journal.stop_request()
        self.stopped_from_outside = request is None
        return request

    def _stop_grace(self) -> float:
        """The grace period of the stop being acted on: the one `trainguard stop --grace` asked
        for, else the run's."""
        return float((self._stop_request() or {}).get("grace_s") or self.options.grace_s)

    def _outside_stop_signal(self) -> int | None:
        """The stop signal being acted on, where it came from outside trainguard (a scheduler's)."""
        return self.signals.stop_requested if self._stop_request() is None else None

    # ------------------------------------------------------------------ state
    def _transition(self, new: RunState, reason: Text | None = None, **data: object) -> None:
        check_transition(self.state, new)
        self.state = new
        self.journal.set_state(new.value, reason=reason, data=dict(data))

    # ------------------------------------------------------------------ the loop
    def supervise(self, *, adopt: bool = False, on_started: Callable[[Run], None] | None = None) -> RunState:
        """Run attempts until the policy ends the run. With ``adopt``, the first attempt is the job
        already running (its supervisor died): it is watched, not started. ``on_started`` is called
        once the job runs (or is watched): the detached start-up handshake."""
        self._on_started = on_started
        self.subreaper = become_subreaper()
        pid = os.getpid()
        self.journal.update(supervisor_pid=pid, supervisor_start=start_time(pid))
        request = self.journal.stop_request()
        if request is not None and self.lock is not None and float(request.get("time", 0)) >= self.lock.taken_at:
            # `stop` asked while this start was under way (of the command that held the lock then)
            self.signals.stop_requested = signal.SIGTERM
        else:
            self.journal.clear_stop_request()  # a request addressed to an earlier supervisor is stale
        default_scanner()  # compile the signatures now, not between a death and the restart
        self.monitor = start_monitoring(self.journal, self.options, notifiers=self.notifiers,
                                        checkpoint_bytes=self.tracker.checkpoint_bytes, clock=self.clock)  # fmt: skip
        self.tracker.recall_recorded_checkpoints()
        self.job_watch = JobWatch(
            signals=self.signals,
            tracker=self.tracker,
            monitor=self.monitor,
            journal=self.journal,
            run_dir=self.run.run_dir,
            hang_timeout_s=self.options.hang_timeout_s,
            peer_timeout_s=self.options.peer_timeout_s,
            housekeeping=self._housekeeping,
            clock=self.clock,
            sleep=self.sleep,
            logs=RunLogs(self.journal, self.run.run_dir),
        )
        attempt_n = self.run.attempts[-1].n if self.run.attempts else 0
        restart_cause = self.run.attempts[-1].cause if self.run.attempts else None
        while True:
            if self.signals.stop_requested is not None:
                self._transition(RunState.STOPPED, stopped_reason(self._outside_stop_signal(), "before_start"))
                self._started()  # after the state: the command that started the run reports it stopped
                return self.state
            if adopt and self.run.attempts and self.run.attempts[-1].ended_at is None:
                outcome, attempt = self._adopt_attempt(self.run.attempts[-1])
            else:
                attempt_n += 1
                outcome, attempt = self._run_attempt(attempt_n, restart_cause)
            adopt = False
            self.history.append(outcome)
            decision = decide(self.history, self.policy, causes.catalogue())
            self.journal.event("decision", {"restart": decision.restart, "reason": decision.reason.en,
                                            "delay_s": decision.delay_s})  # fmt: skip
            if attempt.cause is not None:
                named = f"{attempt.cause} ({attempt.confidence or 0:.2f})"
                self.monitor.alert(
                    "death",
                    "critical",
                    en=f"attempt {attempt.n} died: {named}; {decision.reason.en}",
                    zh=f"第 {attempt.n} 次尝试终止：{named}；{decision.reason.zh}",
                )
                if decision.restart:  # the log says why the next attempt follows (the end of the run says its own)
                    append_marker(attempt.log_path, Text(f"attempt {attempt.n} died: {decision.reason.en}",
                                                         f"第 {attempt.n} 次尝试终止：{decision.reason.zh}"))  # fmt: skip
            if not decision.restart:
                final = RunState(decision.final_state)
                self._transition(final, decision.reason)
                append_marker(attempt.log_path, Text(f"run {final.value}: {decision.reason.en}",
                                                     f"运行结束（{final.value}）：{decision.reason.zh}"))  # fmt: skip
                if final is RunState.FAILED:
                    self.monitor.alert("run_failed", "critical", en=f"run failed: {decision.reason.en}",
                                       zh=f"运行失败：{decision.reason.zh}")  # fmt: skip
                self.journal.flush(force=True)
                return final
            restart_cause = attempt.cause
            self.batch_scale *= decision.batch_scale
            self._transition(RunState.BACKOFF, decision.reason, delay_s=decision.delay_s)
            if not self._wait_backoff(decision):
                self._transition(RunState.STOPPED, stopped_reason(self._outside_stop_signal(), "backoff"))
                self.journal.flush(force=True)
                return self.state

    def _started(self) -> None:
        if self._on_started is not None:
            callback, self._on_started = self._on_started, None
            callback(self.run)

    def _wait_backoff(self, decision: Decision) -> bool:
        deadline = self.clock() + decision.delay_s
        while self.clock() < deadline:
            if self.signals.stop_requested is not None:
                return False
            self._housekeeping()
            self.sleep(min(POLL_S, max(0.0, deadline - self.clock())))
        return self.signals.stop_requested is None

    def _housekeeping(self) -> None:
        """Every tick: write what the registry could not take, and notice a removed state folder."""
        self.journal.flush()
        if self.lock is not None and not self.lock.still_ours():
            # The run's folder was removed: take the lock again in the folder the journal recreated,
            # so that no second supervisor can start for this run.
            with contextlib.suppress(OSError, AlreadyWatched):
                Path(self.run.run_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
                fresh = SupervisorLock.acquire(self.run.run_dir, self.run.id, patience_s=0)
                self.lock.release()
                self.lock = fresh

    # ------------------------------------------------------------------ one attempt
    def _run_attempt(self, n: int, restart_cause: str | None) -> tuple[Outcome, Attempt]:
        prepared = prepare_attempt(self.journal, self.options, n, restart_cause=restart_cause,
                                   batch_scale=self.batch_scale, subreaper=self.subreaper)  # fmt: skip
        process = prepared.spawn()
        try:  # the job waits at its gate until it is recorded; if recording fails it never runs
            attempt = prepared.record_of(process)
            if self.state is RunState.BACKOFF:
                self._transition(RunState.STARTING)
            self.journal.update(containment=prepared.containment.description)
            # Read before the job runs: at its death they say whether the OOM killer struck meanwhile.
            attempt.containment = {**(attempt.containment or {}), "oom_counts": asdict(oom_counters.read())}
            # Recorded, the job goes through at once: a kill from here on leaves a job its run knows.
            # A registry that cannot be written (a full state disk) holds the record in memory, and
            # the job starts all the same: supervision never waits on the state disk.
            self.journal.start_attempt(attempt)
            prepared.open_gate()
        finally:
            prepared.close_gate()
        self._transition(RunState.RUNNING, Text(f"attempt {n}", f"第 {n} 次尝试"), pid=process.pid)
        self._started()
        watch = AttemptWatch(process, attempt, prepared.containment, prepared.read_fd, self.clock(),
                             kernel=prepared.kernel_tail, launch_record=prepared.launch_record)  # fmt: skip
        watch.foresight = foresight_for(self.journal, self.monitor, self.options, attempt, prepared.containment,
                                        process.pid, checkpoint_bytes=self.tracker.checkpoint_bytes)  # fmt: skip
        return self._conclude(watch)

    def _adopt_attempt(self, attempt: Attempt) -> tuple[Outcome, Attempt]:
        self.journal.event("adopted", {"n": attempt.n, "pid": attempt.pid})
        if self.state is not RunState.RUNNING:
            self._transition(RunState.RUNNING, Text(f"attempt {attempt.n} taken back under watch",
                                                       f"重新接管第 {attempt.n} 次尝试"), pid=attempt.pid)  # fmt: skip
        self._started()
        return self._conclude(AttemptWatch.of_adopted(attempt, self.clock))

    def _conclude(self, watch: AttemptWatch) -> tuple[Outcome, Attempt]:
        """Watch the attempt to its end, empty its cgroups, name the death, and sum it up for the policy."""
        opts, attempt = self.options, watch.attempt
        watch.last_progress_mono = watch.started_mono
        watch.last_log_size = watch.log_size()
        watch.last_checkpoint = attempt.resumed_from
        watch.pids = {watch.process.pid}
        try:
            returncode = self._watch(watch)
            stopped = self.signals.stop_requested is not None and not watch.hung and not watch.peers_missing
            # The job may have ended on the signal by itself (sent to its whole group) before the
            # stop was acted on: where the signal came from is read here all the same.
            outside_signal = self._outside_stop_signal() if stopped else None
            attempt.ended_at = time.time()
            leftovers = watch.containment.kill_all()
            if leftovers:
                self.journal.event("leftovers_killed", {"n": attempt.n, "processes": leftovers})
            oom_kills = watch.containment.groups.oom_kills() if watch.containment.groups else 0
            watch.containment.remove()

            status = ExitStatus.from_number(returncode) if returncode not in (None, EXIT_UNKNOWN) else None
            attempt.exit_code = status.code if status else None
            attempt.signal = status.signal if status else None
            attempt.progress = progress.read(progress_file(self.run.run_dir, attempt.n)) or attempt.progress
            self.tracker.learn_checkpoint_dir(attempt.progress or {})
            watch.save_launch_record(self.run.run_dir)
            self.tracker.record_checkpoints(attempt, attempt.progress or {}, scan=True)
            active = watch.last_active(self.clock, self.job_watch.last_written(watch))
            attempt.progress = {**(attempt.progress or {}), "last_active_time": active}
            latest = self.tracker.newest_checkpoint()
            new_checkpoint = latest not in (None, attempt.resumed_from)
            new_lines = count_lines(watch)
            name_the_death(watch, returncode, status, stopped=stopped, oom_kills=oom_kills, monitor=self.monitor,
                           options=self.options, run_dir=self.run.run_dir)  # fmt: skip
            if watch.hung:
                append_marker(attempt.log_path, Text(f"no progress for {opts.hang_timeout_s:g} s: stopped",
                                                     f"{opts.hang_timeout_s:g} 秒没有进展：已停止"))  # fmt: skip
            if watch.peers_missing:
                append_marker(attempt.log_path, Text(
                    f"the other nodes did not join in {opts.peer_timeout_s:g} s: stopped; the run ends with peer_failure",
                    f"其他节点在 {opts.peer_timeout_s:g} 秒内没有加入：已停止；运行以 peer_failure 结束"))  # fmt: skip
            if self.job_watch.logs is not None:
                self.job_watch.logs.attempt_ended(attempt)
            self.journal.end_attempt(attempt)
        finally:
            watch.close()
        outcome = Outcome(
            exit_code=attempt.exit_code,
            signal=attempt.signal,
            cause=attempt.cause,
            stopped_by_user=stopped,
            outside_stop_signal=outside_signal,
            new_checkpoint=new_checkpoint,
            new_lines=new_lines,
            peers_missing=watch.peers_missing,
            confidence=attempt.confidence if attempt.confidence is not None else 1.0,
        )
        return outcome, attempt

    def _watch(self, watch: AttemptWatch) -> int:
        """The job's exit status, once it has exited or been stopped: on request, hung, or left
        waiting for the other nodes."""
        ending = self.job_watch.follow(watch)
        if ending is WatchEnd.EXITED:
            return watch.returncode
        grace_s = self.options.grace_s
        if ending is WatchEnd.STOP_REQUESTED:
            signum = self.signals.stop_requested
            self._transition(RunState.STOPPING, Text(f"stopping on signal {signum}",
                                                     f"收到信号 {signum}，正在停止"))  # fmt: skip
            grace_s = self._stop_grace()
        return watch.stop_job(self.options.stop_signal, grace_s, clock=self.clock, sleep=self.sleep)
