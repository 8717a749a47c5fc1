"""The supervisor: runs a job attempt after attempt, names each death, restarts by policy, resumes.

The job runs in its own session and its own cgroups, with its output going straight into a log file
of the attempt's own (no pipe), so neither a closed terminal nor the supervisor's death can take it
down, and nothing it started outlives the attempt. The supervisor's record of the run lives in
memory first (``Journal``): a full or removed state disk does not stop supervision. Signal handlers
only record; the loop acts on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import select
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from trainguard import causes, progress
from trainguard._i18n import Text, choose_language
from trainguard._proc import ProcessRef, catches_signal, start_time
from trainguard.checkpoint import layouts
from trainguard.checkpoint.resume import checkpoint_bytes, choose_resume, find_resume
from trainguard.diagnosis import launch
from trainguard.diagnosis.evidence import ExitStatus, Observation
from trainguard.diagnosis.scan import read_blocks
from trainguard.diagnosis.signatures import Role
from trainguard.monitor.exporter import TrainguardCollector, kernel_xid_counter, serve
from trainguard.monitor.notify import from_record
from trainguard.monitor.runwatch import RunMonitor
from trainguard.paths import open_private
from trainguard.postmortem import default_scanner, diagnosis_dict
from trainguard.probes import kernel_log
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt, Registry, Run
from trainguard.store.states import RunState, check_transition
from trainguard.supervisor import launchers
from trainguard.supervisor.autopsy import attempt_report
from trainguard.supervisor.containment import Containment, become_subreaper, contain, stop_gracefully
from trainguard.supervisor.job import GATE_OPEN, JobOptions, gated_argv, job_argv, job_environment
from trainguard.supervisor.lock import AlreadyWatched, SupervisorLock
from trainguard.supervisor.policy import STARTUP_LINES, Decision, Outcome, RestartPolicy, decide

POLL_S = 0.1
TICK_S = 1.0  # how often the job's tree, progress, samples and the registry queue are looked at
PROGRESS_SAVE_S = 5.0  # how often the job's reported progress is written to the registry

EXIT_UNKNOWN = -(1 << 16)  # an adopted job is not our child: its exit status cannot be had


def attempt_log_name(n: int) -> str:
    return f"attempt-{n}.log"


class _AdoptedProcess:
    """The running job of a run whose supervisor died: watched by identity, since it is not our child."""

    def __init__(self, ref: ProcessRef) -> None:
        self.ref = ref
        self.pid = ref.pid

    def poll(self) -> int | None:
        return None if self.ref.alive() else EXIT_UNKNOWN

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(POLL_S)
        return code


@dataclass
class _AttemptWatch:
    """What the supervisor learns while one attempt runs."""

    process: Any  # subprocess.Popen or _AdoptedProcess
    attempt: Attempt
    containment: Containment
    log_fd: int | None  # kept open: the log stays readable even if someone deletes the file
    started_mono: float
    last_progress_mono: float = 0.0
    last_log_size: int = 0
    last_checkpoint: str | None = None
    last_progress_saved: float = 0.0
    hung: bool = False
    peers_missing: bool = False
    silent_since: float | None = None  # a hung job's last output, wall time
    pidfd: int | None = None
    kernel: kernel_log.KernelTail | None = None
    pids: set[int] = field(default_factory=set)
    launch_record: dict[str, Any] | None = None  # the job runs under a launcher: what is known of its ranks
    workers: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (rank, local rank)

    @property
    def log_path(self) -> str | None:
        return f"/proc/self/fd/{self.log_fd}" if self.log_fd is not None else None


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
        self.options = options
        self.policy = policy
        self.lock = lock
        self.clock = clock
        self.sleep = sleep
        self.state = RunState(run.state)
        self.stop_requested: int | None = None
        self._stop_signals = 0  # how many came, the one that ended the run included
        self.save_requested: int | None = None  # a save request not yet passed on to the job
        self._save_request_new = False
        self.history: list[Outcome] = []
        self.batch_scale = 1.0
        self.notifiers = from_record(run.options.get("notify", []))
        self._wakeup_read: int | None = None
        self._on_started: Callable[[Run], None] | None = None
        self.subreaper = False
        # A stop signal that `trainguard stop` did not announce came from a scheduler or a container
        # runtime: under `run --foreground` that is a preemption (exit 75), not a person's stop.
        self.stopped_from_outside = False
        # Checkpoints recorded as events (path -> the time it was written): each is recorded once.
        self._checkpoints_seen: dict[str, float] = {}

    # ------------------------------------------------------------------ signals
    def install_signal_handlers(self) -> None:
        # A closed terminal is no reason to stop. Not SIG_IGN: the job would inherit it through exec
        # and could not be told anything with SIGHUP (a handler is reset to the default there).
        signal.signal(signal.SIGHUP, lambda *_: None)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        # A pre-timeout signal (`sbatch --signal=B:USR1@120`) asks the job to save, not the run to stop.
        signal.signal(signal.SIGUSR1, self._on_save_signal)
        # A stop signal wakes the wait below at once (the handler itself only records it).
        self._wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_write)
        # One that came while the supervisor was starting (blocked until now) is delivered here.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self.stop_requested = signum
        self._stop_signals += 1

    def write_what_is_left(self) -> None:
        """The run has ended: the records the registry could not take (a full state disk) are the
        only account of how, so this process stays until they are written. One stop signal during
        the wait is a `trainguard stop` that has nothing left to stop; a second one gives up."""
        signals_before = self._stop_signals
        self.journal.drain(give_up=lambda: self._stop_signals >= signals_before + 2, sleep=self.sleep)

    def _on_save_signal(self, signum: int, _frame: object) -> None:
        self.save_requested = signum
        self._save_request_new = True

    def _stop_grace(self) -> float:
        """The grace period of the stop being acted on: the one `trainguard stop --grace` asked
        for, else the run's."""
        request = self.journal.stop_request()
        self.stopped_from_outside = request is None
        return float((request or {}).get("grace_s") or self.options.grace_s)

    # ------------------------------------------------------------------ state
    def _transition(self, new: RunState, reason: Text | None = None, **data: object) -> None:
        check_transition(self.state, new)
        self.state = new
        self.journal.set_state(new.value, reason=reason, data=dict(data))

    def _append_marker(self, log_file: str | None, text: Text) -> None:
        """A line in the attempt's own log, after the job is gone (a person following the file with
        `tail -F` sees why it ended), in the language of the person who started the run. Best
        effort: a full disk loses the line, not the supervision."""
        if log_file is None:
            return
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        with contextlib.suppress(OSError):
            fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)  # never recreate a removed log
            with os.fdopen(fd, "a", encoding="utf-8") as log:
                log.write(f"==== trainguard {stamp} · {text.pick(choose_language(None, os.environ))} ====\n")

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
            self.stop_requested = signal.SIGTERM
        else:
            self.journal.clear_stop_request()  # a request addressed to an earlier supervisor is stale
        default_scanner()  # compile the signatures now, not between a death and the restart
        Path(self.options.checkpoint_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.monitor = RunMonitor(
            self.journal,
            interval_s=self.options.sample_interval_s,
            disk_paths=list(dict.fromkeys([self.run.run_dir, self.options.checkpoint_dir])),
            notifiers=self.notifiers,
            checkpoint_bytes=self._checkpoint_bytes,
            clock=self.clock,
        )
        if self.options.metrics_port is not None:
            collector = TrainguardCollector(self.journal.registry, run_id=self.run.id, xid_counts=kernel_xid_counter())
            serve(self.options.metrics_port, self.options.metrics_bind, collector)
        self._checkpoints_seen = self.journal.checkpoints_recorded()
        attempt_n = self.run.attempts[-1].n if self.run.attempts else 0
        restart_cause = self.run.attempts[-1].cause if self.run.attempts else None
        while True:
            if self.stop_requested is not None:
                self._stop_grace()
                self._transition(RunState.STOPPED, Text("stopped on request before the attempt started", "在尝试开始前按请求停止"))
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
            if not decision.restart:
                final = RunState(decision.final_state)
                self._transition(final, decision.reason)
                self._append_marker(attempt.log_path, Text(f"run {final.value}: {decision.reason.en}",
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
                self._stop_grace()
                self._transition(RunState.STOPPED, Text("stopped on request while waiting to restart", "在等待重启时按请求停止"))
                self.journal.flush(force=True)
                return self.state

    def _started(self) -> None:
        if self._on_started is not None:
            callback, self._on_started = self._on_started, None
            callback(self.run)

    def _wait_backoff(self, decision: Decision) -> bool:
        deadline = self.clock() + decision.delay_s
        while self.clock() < deadline:
            if self.stop_requested is not None:
                return False
            self._housekeeping()
            self.sleep(min(POLL_S, max(0.0, deadline - self.clock())))
        return self.stop_requested is None

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
        opts = self.options
        run_dir = Path(self.run.run_dir)
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        choice = choose_resume(opts.checkpoint_dir, opts.checkpoint_glob, opts.checkpoint_layout)
        resume_from = choice.path
        if choice.skipped:  # incomplete ones are reported, never chosen, never deleted
            self.journal.event("checkpoints_skipped", {"attempt": n, "skipped": list(choice.skipped)})
        error_file, progress_file = self._error_file(n), self._progress_file(n)
        launcher_error_file = os.path.join(run_dir, f"attempt-{n}.launcher-error.json")
        for stale in (error_file, progress_file, launcher_error_file, *self._rank_files_of(error_file, progress_file)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        env = job_environment(
            os.environ,
            run_id=self.run.id,
            attempt=n,
            restart_cause=restart_cause,
            checkpoint_dir=opts.checkpoint_dir,
            resume_from=resume_from,
            batch_scale=self.batch_scale,
            error_file=error_file,
            progress_file=progress_file,
        )
        launch_record = self._prepare_launcher(env, n, launcher_error_file)
        log_file = str(run_dir / attempt_log_name(n))
        # A fresh file per attempt: appending to one that already holds data is measurably slower.
        log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        read_fd = os.open(log_file, os.O_RDONLY | os.O_CLOEXEC)
        self._point_output_log(attempt_log_name(n))
        containment = contain(f"trainguard-{self.run.id}-{n}", opts.memory_limit, subreaper=self.subreaper)
        kernel_tail = kernel_log.KernelTail()  # opened before the job starts: none of its records are missed
        argv = gated_argv(containment.join_argv(job_argv(opts.command, opts.resume_arg, resume_from)))
        gate_read, gate_write = os.pipe2(os.O_CLOEXEC)
        started_wall = time.time()
        try:
            process = subprocess.Popen(
                argv,
                cwd=opts.cwd,
                env=env,
                stdin=gate_read,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,  # its own session: no terminal's SIGHUP reaches it
            )
        except OSError:
            os.close(read_fd)
            os.close(gate_write)
            containment.remove()
            kernel_tail.close()
            raise
        finally:
            os.close(log_fd)
            os.close(gate_read)
        try:  # the job waits at its gate until it is recorded; if recording fails it never runs
            job = ProcessRef(process.pid, start_time(process.pid))
            containment.job = job
            attempt = Attempt(
                n=n,
                started_at=started_wall,
                pid=process.pid,
                pid_start=job.start,
                resumed_from=resume_from,
                log_path=log_file,
                containment=containment.to_record(),
                skipped=list(choice.skipped) or None,
            )
            if self.state is RunState.BACKOFF:
                self._transition(RunState.STARTING)
            self.journal.update(containment=containment.description)
            # Recorded, the job goes through at once: a kill from here on leaves a job its run knows.
            # A registry that cannot be written (a full state disk) holds the record in memory, and
            # the job starts all the same: supervision never waits on the state disk.
            self.journal.start_attempt(attempt)
            with contextlib.suppress(OSError):  # a gate nobody reads: the job died already, it is watched
                os.write(gate_write, GATE_OPEN)
        finally:
            os.close(gate_write)
        self._transition(RunState.RUNNING, Text(f"attempt {n}", f"第 {n} 次尝试"), pid=process.pid)
        self._started()
        watch = _AttemptWatch(process, attempt, containment, read_fd, self.clock(), kernel=kernel_tail,
                              launch_record=launch_record)  # fmt: skip
        return self._conclude(watch)

    def _prepare_launcher(self, env: dict[str, str], n: int, launcher_error_file: str) -> dict[str, Any] | None:
        """A launcher's job (torchrun, DeepSpeed, Accelerate): its ranks' files go to the attempt's
        folder through the launcher's environment, and the record of where they are is written."""
        launcher = launchers.recognise(self.options.command)
        if launcher is None:
            return None
        ranks_dir = os.path.join(self.run.run_dir, f"attempt-{n}.ranks")
        env.update(launchers.environment(launcher, env, ranks_dir=ranks_dir, error_file=launcher_error_file))
        record = {
            "launcher": launcher.kind,
            "multi_node": launcher.multi_node(env),
            "log_dirs": launchers.log_dirs(launcher, env),
            "launcher_error_file": env.get("TORCHELASTIC_ERROR_FILE"),
            "host": socket.gethostname(),
            "workers": {},
            "hung_ranks": [],
        }
        launchers.write_record(launchers.record_path(self.run.run_dir, n), record)
        return record

    @staticmethod
    def _rank_files_of(*paths: str) -> list[str]:
        return [found for path in paths for found in glob.glob(glob.escape(path) + ".rank*")]

    def _adopt_attempt(self, attempt: Attempt) -> tuple[Outcome, Attempt]:
        job = ProcessRef(attempt.pid or 0, attempt.pid_start)
        self.journal.event("adopted", {"n": attempt.n, "pid": attempt.pid})
        if self.state is not RunState.RUNNING:
            self._transition(RunState.RUNNING, Text(f"attempt {attempt.n} taken back under watch",
                                                       f"重新接管第 {attempt.n} 次尝试"), pid=attempt.pid)  # fmt: skip
        self._started()
        containment = Containment.from_record(attempt.containment, job)
        read_fd = None
        if attempt.log_path:
            with contextlib.suppress(OSError):
                read_fd = os.open(attempt.log_path, os.O_RDONLY | os.O_CLOEXEC)
        # No kernel tail: the records of an adopted job's death may predate the adoption.
        watch = _AttemptWatch(_AdoptedProcess(job), attempt, containment, read_fd, self.clock())
        return self._conclude(watch)

    def _point_output_log(self, target: str) -> None:
        """output.log is a symlink to the current attempt's log (`tail -F output.log` follows restarts)."""
        link = Path(self.run.log_path)
        tmp = link.with_name(f".{link.name}.{os.getpid()}")
        with contextlib.suppress(OSError):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            tmp.symlink_to(target)
            os.replace(tmp, link)

    def _error_file(self, n: int) -> str:
        return os.path.join(self.run.run_dir, f"attempt-{n}.error.json")

    def _progress_file(self, n: int) -> str:
        return os.path.join(self.run.run_dir, f"attempt-{n}.progress.json")

    def _conclude(self, watch: _AttemptWatch) -> tuple[Outcome, Attempt]:
        """Watch the attempt to its end, empty its cgroups, name the death, and sum it up for the policy."""
        opts, attempt = self.options, watch.attempt
        watch.last_progress_mono = watch.started_mono
        watch.last_log_size = self._log_size(watch)
        watch.last_checkpoint = attempt.resumed_from
        watch.pids = {watch.process.pid}
        try:
            returncode = self._watch(watch)
            stopped = self.stop_requested is not None and not watch.hung and not watch.peers_missing
            attempt.ended_at = time.time()
            leftovers = watch.containment.kill_all()
            if leftovers:
                self.journal.event("leftovers_killed", {"n": attempt.n, "processes": leftovers})
            oom_kills = watch.containment.groups.oom_kills() if watch.containment.groups else 0
            watch.containment.remove()

            status = ExitStatus.from_number(returncode) if returncode not in (None, EXIT_UNKNOWN) else None
            attempt.exit_code = status.code if status else None
            attempt.signal = status.signal if status else None
            attempt.progress = progress.read(self._progress_file(attempt.n)) or attempt.progress
            self._learn_checkpoint_dir(attempt.progress or {})
            self._save_launch_record(watch)
            self._record_checkpoints(attempt, attempt.progress or {}, scan=True)
            attempt.progress = {**(attempt.progress or {}), "last_active_time": self._last_active(watch, attempt)}
            latest = self._newest_checkpoint()
            new_checkpoint = latest not in (None, attempt.resumed_from)
            new_lines = self._count_lines(watch)
            stopped_itself = self._stopped_on_signal(attempt) if returncode == 0 and not stopped else None
            if (returncode == 0 and stopped_itself is None) or stopped:
                attempt.cause = None
            else:
                extra = [stopped_itself] if stopped_itself else []
                diagnosis = self._diagnose(watch, status, oom_kills, extra)
                attempt.cause = diagnosis["cause"]
                attempt.confidence = diagnosis["confidence"]
                attempt.diagnosis = diagnosis
            if watch.hung:
                self._append_marker(attempt.log_path, Text(f"no progress for {opts.hang_timeout_s:g} s: stopped",
                                                           f"{opts.hang_timeout_s:g} 秒没有进展：已停止"))  # fmt: skip
            if watch.peers_missing:
                self._append_marker(attempt.log_path, Text(
                    f"the other nodes did not join in {opts.peer_timeout_s:g} s: stopped; the run ends with peer_failure",
                    f"其他节点在 {opts.peer_timeout_s:g} 秒内没有加入：已停止；运行以 peer_failure 结束"))  # fmt: skip
            self.journal.end_attempt(attempt)
        finally:
            if watch.kernel is not None:
                watch.kernel.close()
            if watch.log_fd is not None:
                os.close(watch.log_fd)
        outcome = Outcome(
            exit_code=attempt.exit_code,
            signal=attempt.signal,
            cause=attempt.cause,
            stopped_by_user=stopped,
            new_checkpoint=new_checkpoint,
            new_lines=new_lines,
            peers_missing=watch.peers_missing,
        )
        return outcome, attempt

    # ------------------------------------------------------------------ watching one attempt
    def _wait_for_exit(self, watch: _AttemptWatch, timeout_s: float) -> None:
        """Sleep until the job exits, a signal arrives, or the timeout passes: a pidfd makes the
        job's death wake the supervisor at once, so a restart does not wait for a polling tick."""
        if watch.pidfd is None:
            self.sleep(min(POLL_S, timeout_s))
            return
        poller = select.poll()
        poller.register(watch.pidfd, select.POLLIN)
        if self._wakeup_read is not None:
            poller.register(self._wakeup_read, select.POLLIN)
        poller.poll(max(0, int(timeout_s * 1000)))
        if self._wakeup_read is not None:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wakeup_read, 512)

    def _watch(self, watch: _AttemptWatch) -> int:
        try:
            watch.pidfd = os.pidfd_open(watch.process.pid)
        except (AttributeError, OSError):
            watch.pidfd = None  # an old kernel, or the job is already gone: poll every tick instead
        try:
            return self._watch_loop(watch)
        finally:
            if watch.pidfd is not None:
                os.close(watch.pidfd)

    def _watch_loop(self, watch: _AttemptWatch) -> int:
        next_tick = self.clock()
        n = watch.attempt.n
        while True:
            returncode = watch.process.poll()
            if returncode is not None:
                return returncode
            now = self.clock()
            if self.save_requested is not None and (self._save_request_new or now >= next_tick):
                self._pass_on_save_request(watch, self.save_requested)
            if self.stop_requested is not None and self.state is not RunState.STOPPING:
                self._transition(RunState.STOPPING, Text(f"stopping on signal {self.stop_requested}",
                                                         f"收到信号 {self.stop_requested}，正在停止"))  # fmt: skip
                return self._stop_job(watch, self._stop_grace())
            if now >= next_tick:
                next_tick = now + TICK_S
                self._housekeeping()
                watch.pids |= _descendants(watch.process.pid)
                self._learn_workers(watch)
                self._check_progress(watch, now)
                self.monitor.tick(watch.process.pid)
                if self._waiting_for_peers(watch):
                    watch.last_progress_mono = now  # waiting for the other nodes is not a hang
                    if self.options.peer_timeout_s and now - watch.started_mono >= self.options.peer_timeout_s:
                        watch.peers_missing = True
                        self.journal.event("peers_missing", {"attempt": n, "waited_s": now - watch.started_mono})
                        self.monitor.alert(
                            "peers_missing",
                            "critical",
                            en=f"attempt {n}: the other nodes did not join in {self.options.peer_timeout_s:g} s",
                            zh=f"第 {n} 次尝试：其他节点 {self.options.peer_timeout_s:g} 秒内没有加入",
                        )
                        return self._stop_job(watch, self.options.grace_s)
                if self.options.hang_timeout_s and now - watch.last_progress_mono >= self.options.hang_timeout_s:
                    watch.hung = True
                    watch.silent_since = self._last_active(watch, watch.attempt)  # before markers are added
                    self._dump_stacks(watch, n)
                    silent = now - watch.last_progress_mono
                    self.journal.event("hang", {"attempt": n, "silent_s": silent})
                    self.monitor.alert(
                        "hang",
                        "critical",
                        en=f"attempt {n}: no progress for {silent:.0f} s; restarting",
                        zh=f"第 {n} 次尝试：{silent:.0f} 秒没有进展；正在重启",
                    )
                    return self._stop_job(watch, self.options.grace_s)
            self._wait_for_exit(watch, max(0.0, next_tick - self.clock()))

    @staticmethod
    def _waiting_for_peers(watch: _AttemptWatch) -> bool:
        """A launcher's job across nodes whose workers have not started: its rendezvous waits for
        the other nodes (torchrun starts the workers once every node has joined)."""
        record = watch.launch_record
        if record is None or not record.get("multi_node"):
            return False
        return not any(rank >= 0 for rank, _local in watch.workers.values())

    def _learn_workers(self, watch: _AttemptWatch) -> None:
        """Which process is which rank (from its environment), learnt while they live: the stack
        dumps and the diagnosis name ranks, not pids."""
        if watch.launch_record is None:
            return
        for pid in watch.pids - watch.workers.keys():
            identity = launchers.worker_identity(pid)
            watch.workers[pid] = identity if identity is not None else (-1, -1)

    def _save_launch_record(self, watch: _AttemptWatch) -> None:
        if watch.launch_record is None:
            return
        watch.launch_record["workers"] = {
            str(pid): {"rank": rank, "local_rank": local} for pid, (rank, local) in watch.workers.items() if rank >= 0
        }
        launchers.write_record(launchers.record_path(self.run.run_dir, watch.attempt.n), watch.launch_record)

    def _log_size(self, watch: _AttemptWatch) -> int:
        if watch.log_fd is None:
            return 0
        try:
            return os.fstat(watch.log_fd).st_size
        except OSError:
            return 0

    def _newest_checkpoint(self) -> str | None:
        opts = self.options
        return find_resume(opts.checkpoint_dir, opts.checkpoint_glob, layout=opts.checkpoint_layout, settle_s=0)

    def _checkpoint_bytes(self) -> int | None:
        newest = self._newest_checkpoint()
        if newest is None:
            return None
        return checkpoint_bytes(newest)

    def _check_progress(self, watch: _AttemptWatch, now: float) -> None:
        """New output, a new checkpoint or a new step reported by the job all count as progress."""
        size = self._log_size(watch)
        latest = self._newest_checkpoint()
        reported = progress.read(self._progress_file(watch.attempt.n))
        step_moved = reported.get("step_time") != (watch.attempt.progress or {}).get("step_time")
        self._record_checkpoints(watch.attempt, reported, scan=latest != watch.last_checkpoint)
        if size != watch.last_log_size or latest != watch.last_checkpoint or step_moved:
            watch.last_log_size = size
            watch.last_checkpoint = latest
            watch.last_progress_mono = now
        self._learn_checkpoint_dir(reported)
        if reported and step_moved:
            watch.attempt.progress = reported
            if now - watch.last_progress_saved >= PROGRESS_SAVE_S:
                watch.last_progress_saved = now
                self.journal.save_progress(watch.attempt)

    def _learn_checkpoint_dir(self, reported: dict) -> None:
        """The job keeps its checkpoints elsewhere than TRAINGUARD_CHECKPOINT_DIR (it gave its own
        folder to Checkpointer): resume and report from where they really are."""
        folder = reported.get("checkpoint_dir")
        if not folder or folder == self.options.checkpoint_dir or self.options.checkpoint_glob:
            return
        self.journal.event("checkpoint_dir_learned", {"from": self.options.checkpoint_dir, "to": folder})
        self.options = dataclasses.replace(self.options, checkpoint_dir=folder)
        self.journal.update(options={**self.run.options, "checkpoint_dir": folder})

    def _last_active(self, watch: _AttemptWatch, attempt: Attempt) -> float:
        """When the job was last seen active, wall time: its last output (the log's modification
        time), else the supervisor's last sight of progress (output, a checkpoint, a step)."""
        ended = attempt.ended_at or time.time()
        if watch.silent_since is not None:
            return min(ended, watch.silent_since)
        if watch.log_fd is not None:
            with contextlib.suppress(OSError):
                return min(ended, os.fstat(watch.log_fd).st_mtime)
        return ended - max(0.0, self.clock() - watch.last_progress_mono)

    def _record_checkpoints(self, attempt: Attempt, reported: dict[str, Any], *, scan: bool) -> None:
        """Record each checkpoint once, as an event at the time it was written, so that the report
        and goodput see every one even after pruning removed it: those the job reported saving
        (``trainguard.progress``), and with ``scan`` the complete ones in the folder now."""
        found: list[tuple[str, int | None, float]] = []
        for entry in reported.get("saves") or ():
            with contextlib.suppress(TypeError, ValueError, IndexError):
                found.append((str(entry[2]), int(entry[0]), float(entry[1])))
        if scan:
            found += self._complete_checkpoints()
        for path, step, written in sorted(found, key=lambda item: item[2]):
            seen = self._checkpoints_seen.get(path)
            if seen is not None and abs(seen - written) < 1.0:
                continue
            self._checkpoints_seen[path] = written
            during = attempt.n if written >= attempt.started_at else None
            self.journal.event("checkpoint", {"attempt": during, "path": path, "step": step}, at=written)

    def _complete_checkpoints(self) -> list[tuple[str, int | None, float]]:
        opts = self.options
        if opts.checkpoint_glob is None:
            return [(c.path, c.step, c.time) for c in layouts.scan(opts.checkpoint_dir, opts.checkpoint_layout)
                    if c.complete]  # fmt: skip
        pattern = opts.checkpoint_glob
        if not os.path.isabs(pattern):
            pattern = os.path.join(opts.checkpoint_dir, pattern)
        found = []
        for path in glob.glob(pattern):
            with contextlib.suppress(OSError):
                if os.path.isfile(path) and os.path.getsize(path) > 0:
                    found.append((path, None, os.path.getmtime(path)))
        return found

    def _pass_on_save_request(self, watch: _AttemptWatch, signum: int) -> None:
        """A save request (SIGUSR1) goes to the job's processes that handle it (the Checkpointer and
        the framework callbacks install a handler), never to the others: a DataLoader worker or a
        launcher without a handler would be killed by it. The run goes on; the job saves and leaves.
        While no process handles it yet (the job is still importing its libraries), the request waits
        and is tried again every tick."""
        name = signal.Signals(signum).name
        pids = sorted(watch.containment.pids() | {watch.process.pid})
        passed = [pid for pid in pids if catches_signal(pid, signum) and ProcessRef.of(pid).signal(signum)]
        noted_before = not self._save_request_new
        self._save_request_new = False
        if passed:
            self.save_requested = None
            self.journal.event("save_requested", {"attempt": watch.attempt.n, "signal": signum, "passed_to": passed})
            listed = ", ".join(map(str, passed))
            self._append_marker(watch.attempt.log_path, Text(f"{name}: a save request, passed on to process(es) {listed}",
                                                             f"{name}：保存请求，已转发给进程 {listed}"))  # fmt: skip
        elif not noted_before:
            self.journal.event("save_request_waiting", {"attempt": watch.attempt.n, "signal": signum})
            self._append_marker(watch.attempt.log_path, Text(
                f"{name}: a save request, but no process of the job handles {name} yet (trainguard's Checkpointer "
                "does): passed on once one does",
                f"{name}：保存请求，但作业中还没有进程处理 {name}（trainguard 的 Checkpointer 会处理）：有进程处理后再转发"))

    def _stop_job(self, watch: _AttemptWatch, grace_s: float) -> int:
        if watch.containment.job is None:
            watch.containment.job = ProcessRef(watch.process.pid)
        stop_gracefully(
            watch.containment,
            self.options.stop_signal,
            grace_s,
            job_exited=lambda: watch.process.poll() is not None,
            clock=self.clock,
            sleep=self.sleep,
        )
        return watch.process.wait()

    def _dump_stacks(self, watch: _AttemptWatch, n: int) -> None:
        """Every process's Python stack into the run's folder (py-spy); for a launcher's job each
        worker's rank is named, and the ranks that are not waiting in a collective while the others
        are (the ones the job waits for) are recorded for the diagnosis."""
        target = Path(self.run.run_dir) / f"hang-attempt-{n}.txt"
        py_spy = shutil.which("py-spy")
        try:
            if py_spy is None:
                with open_private(target) as out:
                    out.write("py-spy is not installed (pip install py-spy): no stacks could be dumped\n")
                self._append_marker(watch.attempt.log_path, Text("no progress; py-spy not installed, no stacks",
                                                                 "没有进展；未安装 py-spy，无法导出调用栈"))  # fmt: skip
                return
            self._learn_workers(watch)
            worker_stacks: dict[int, str] = {}
            with open_private(target) as out:
                for pid in sorted(watch.containment.pids() or watch.pids):
                    rank, local = watch.workers.get(pid) or launchers.worker_identity(pid) or (-1, -1)
                    named = f" (rank {rank}, local rank {local})" if rank >= 0 else ""
                    out.write(f"--- process {pid}{named} ---\n")
                    out.flush()
                    stack = self._py_spy(py_spy, pid, watch)
                    out.write(stack)
                    if rank >= 0 and stack.strip():
                        worker_stacks[rank] = worker_stacks.get(rank, "") + stack
            if watch.launch_record is not None:
                watch.launch_record["hung_ranks"] = list(launch.hung_ranks(worker_stacks))
        except OSError:
            return  # a full state disk loses the stacks, not the restart
        timeout = f"{self.options.hang_timeout_s:g}"
        self._append_marker(watch.attempt.log_path, Text(f"no progress for {timeout} s; stacks in {target}",
                                                         f"{timeout} 秒没有进展；调用栈见 {target}"))  # fmt: skip

    @staticmethod
    def _py_spy(py_spy: str, pid: int, watch: _AttemptWatch) -> str:
        dump = subprocess.Popen([py_spy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        watch.containment.helpers.add(dump.pid)
        try:
            output, _ = dump.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            dump.kill()
            output, _ = dump.communicate()
        finally:
            watch.containment.helpers.discard(dump.pid)
        return output.decode("utf-8", "replace")

    # ------------------------------------------------------------------ after a death
    def _count_lines(self, watch: _AttemptWatch, enough: int = STARTUP_LINES + 1) -> int:
        """New lines of the attempt, counted only as far as the crash-loop guard needs to know."""
        if watch.log_path is None:
            return 0
        count = 0
        with contextlib.suppress(OSError), open(watch.log_path, "rb") as log:
            log.seek(watch.attempt.log_offset)
            for block in read_blocks(log, 64 * 1024):
                count += block.count(b"\n")
                if count >= enough:
                    break
        return count

    def _stopped_on_signal(self, attempt: Attempt) -> Observation | None:
        """A job that saved and left its loop because a signal asked it to (a scheduler's SIGTERM, a
        pre-timeout SIGUSR1) exits 0, but its training is not finished: that attempt was preempted."""
        signum = (attempt.progress or {}).get("stop_signal")
        if not signum:
            return None
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        step = (attempt.progress or {}).get("step")
        at_step = f" at step {step}" if step is not None else ""
        return _seen_by_the_supervisor(
            "preempted", 0.95, "progress:stopped_on_signal",
            f"the job received {name}, saved{at_step} and stopped by itself (exit 0): it was asked to stop from "
            "outside trainguard",
        )  # fmt: skip

    def _diagnose(
        self, watch: _AttemptWatch, status: ExitStatus | None, oom_kills: int, extra: list[Observation]
    ) -> dict:
        attempt = watch.attempt
        extra = self.monitor.evidence(attempt.ended_at or time.time()) + extra
        if watch.peers_missing:
            extra.append(
                Observation(
                    source="telemetry",
                    cause="peer_failure",
                    weight=0.99,
                    role=Role.ROOT,
                    rule="supervisor:peers_missing",
                    text=f"the other nodes of the job did not join the launcher's rendezvous within "
                    f"{self.options.peer_timeout_s:g} s (--peer-timeout)",
                )
            )
        if oom_kills:
            limit = (self.options.memory_limit or 0) / 1024**3
            extra.append(_seen_by_the_supervisor(
                "host_oom", 0.99, "cgroup:oom_kill",
                f"the kernel OOM-killed {oom_kills} process(es) in the job's memory cgroup ({limit:.2f} GiB limit)",
            ))  # fmt: skip
        report = attempt_report(
            watch.log_path,
            log_start=attempt.log_offset,
            log_end=None,
            exit_status=None if watch.hung or watch.peers_missing else status,
            started=attempt.started_at,
            ended=attempt.ended_at or time.time(),
            pids=watch.pids | {attempt.pid or 0},
            error_file=self._error_file(attempt.n),
            hang_timeout_s=self.options.hang_timeout_s if watch.hung else None,
            extra=extra,
            kernel_tail=watch.kernel,
        )
        return diagnosis_dict(report.diagnosis, "en", report.first_failure)


def _seen_by_the_supervisor(cause: str, weight: float, rule: str, text: str) -> Observation:
    """Evidence the supervisor itself holds (its cgroup's OOM counter, the job's progress report)."""
    return Observation(source="telemetry", cause=cause, weight=weight, role=Role.ROOT, rule=rule, text=text)


def _descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()
