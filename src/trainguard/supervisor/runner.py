"""The supervisor: runs a job attempt after attempt, names each death, restarts by policy, resumes.

The job runs in its own session with its output going straight into the run's log file (O_APPEND,
no pipe), so neither a closed terminal nor the supervisor's own death can take it down. Signal
handlers only record; the loop acts on them.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from trainguard import causes, progress
from trainguard.diagnosis.evidence import ExitStatus, Observation
from trainguard.diagnosis.scan import read_blocks
from trainguard.diagnosis.signatures import Role
from trainguard.monitor.exporter import TrainguardCollector, kernel_xid_counter, serve
from trainguard.monitor.notify import from_record
from trainguard.monitor.runwatch import RunMonitor
from trainguard.postmortem import default_scanner, diagnosis_dict
from trainguard.probes import cgroups, kernel_log
from trainguard.store.registry import Attempt, Registry, Run
from trainguard.supervisor.autopsy import attempt_report
from trainguard.supervisor.job import JobOptions, choose_resume, find_resume, job_argv, job_environment
from trainguard.supervisor.policy import STARTUP_LINES, Decision, Outcome, RestartPolicy, decide
from trainguard.supervisor.states import RunState, check_transition

POLL_S = 0.1
TREE_SAMPLE_S = 1.0  # how often the job's process tree is read (for kernel records that name a child)


@dataclass
class _AttemptWatch:
    """What the supervisor learns while one attempt runs."""

    process: subprocess.Popen
    started_mono: float
    log_offset: int
    checkpoint_before: str | None
    pids: set[int] = field(default_factory=set)
    last_progress_mono: float = 0.0
    last_log_size: int = 0
    last_checkpoint: str | None = None
    hung: bool = False
    pidfd: int | None = None
    kernel: kernel_log.KernelTail | None = None


EXIT_UNKNOWN = -(1 << 16)  # an adopted job is not our child: its exit status cannot be had


class _AdoptedProcess:
    """The running job of a run whose supervisor died: watched by pid, since it is not our child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        try:
            if psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            pass
        return EXIT_UNKNOWN

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(POLL_S)
        return code


class Supervisor:
    def __init__(
        self,
        registry: Registry,
        run: Run,
        options: JobOptions,
        policy: RestartPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.registry = registry
        self.run = run
        self.options = options
        self.policy = policy
        self.clock = clock
        self.sleep = sleep
        self.state = RunState(run.state)
        self.stop_requested: int | None = None
        self.history: list[Outcome] = []
        self.batch_scale = 1.0
        self.notifiers = from_record(run.options.get("notify", []))
        self._wakeup_read: int | None = None

    # ------------------------------------------------------------------ signals
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal is no reason to stop
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        # A stop signal wakes the wait below at once (the handler itself only records it).
        self._wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_write)

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self.stop_requested = signum

    # ------------------------------------------------------------------ state
    def _transition(self, new: RunState, reason: str | None = None, **data: object) -> None:
        check_transition(self.state, new)
        self.state = new
        self.registry.set_state(self.run.id, new.value, reason=reason, data=dict(data))

    def _log_marker(self, text: str) -> None:
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        with open(self.run.log_path, "a", encoding="utf-8") as log:
            log.write(f"==== trainguard {stamp} · {text} ====\n")

    # ------------------------------------------------------------------ the loop
    def supervise(self, *, adopt: bool = False) -> RunState:
        """Run attempts until the policy ends the run. With ``adopt``, the first attempt is the job
        already running (its supervisor died): it is watched, not started."""
        self.registry.update_run(self.run.id, supervisor_pid=os.getpid())
        default_scanner()  # compile the signatures now, not between a death and the restart
        Path(self.options.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        self.monitor = RunMonitor(
            self.registry,
            self.run.id,
            interval_s=self.options.sample_interval_s,
            disk_paths=list(dict.fromkeys([self.run.run_dir, self.options.checkpoint_dir])),
            notifiers=self.notifiers,
            checkpoint_bytes=self._checkpoint_bytes,
            clock=self.clock,
        )
        if self.options.metrics_port is not None:
            collector = TrainguardCollector(self.registry, run_id=self.run.id, xid_counts=kernel_xid_counter())
            serve(self.options.metrics_port, self.options.metrics_bind, collector)
        attempt_n = len(self.run.attempts)
        restart_cause = self.run.attempts[-1].cause if self.run.attempts else None
        while True:
            attempt_n += 1
            if self.stop_requested is not None:
                self._transition(RunState.STOPPED, "stopped on request before the attempt started")
                return self.state
            if adopt and self.run.attempts and self.run.attempts[-1].ended_at is None:
                attempt_n -= 1
                outcome, attempt = self._adopt_attempt(self.run.attempts[-1])
                adopt = False
            else:
                outcome, attempt = self._run_attempt(attempt_n, restart_cause)
            self.history.append(outcome)
            decision = decide(self.history, self.policy, causes.catalogue())
            self.registry.event(self.run.id, "decision", {"restart": decision.restart, "reason": decision.reason,
                                                           "delay_s": decision.delay_s})  # fmt: skip
            if attempt.cause is not None:
                named = f"{attempt.cause} ({attempt.confidence or 0:.2f})"
                self.monitor.alert(
                    "death",
                    "critical",
                    en=f"attempt {attempt.n} died: {named}; {decision.reason}",
                    zh=f"第 {attempt.n} 次尝试终止：{named}；{decision.reason}",
                )
            if not decision.restart:
                final = RunState(decision.final_state)
                self._transition(final, decision.reason)
                self._log_marker(f"run {final.value}: {decision.reason}")
                if final is RunState.FAILED:
                    self.monitor.alert("run_failed", "critical", en=f"run failed: {decision.reason}",
                                       zh=f"运行失败：{decision.reason}")  # fmt: skip
                return final
            restart_cause = attempt.cause
            self.batch_scale *= decision.batch_scale
            self._transition(RunState.BACKOFF, decision.reason, delay_s=decision.delay_s)
            if not self._wait_backoff(decision):
                self._transition(RunState.STOPPED, "stopped on request during backoff")
                return self.state

    def _wait_backoff(self, decision: Decision) -> bool:
        deadline = self.clock() + decision.delay_s
        while self.clock() < deadline:
            if self.stop_requested is not None:
                return False
            self.sleep(min(POLL_S, max(0.0, deadline - self.clock())))
        return self.stop_requested is None

    def _run_attempt(self, n: int, restart_cause: str | None) -> tuple[Outcome, Attempt]:
        opts = self.options
        choice = choose_resume(opts.checkpoint_dir, opts.checkpoint_glob, opts.checkpoint_layout)
        resume_from = choice.path
        error_file = os.path.join(self.run.run_dir, f"attempt-{n}.error.json")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(error_file)
        env = job_environment(
            os.environ,
            run_id=self.run.id,
            attempt=n,
            restart_cause=restart_cause,
            checkpoint_dir=opts.checkpoint_dir,
            resume_from=resume_from,
            batch_scale=self.batch_scale,
            error_file=error_file,
            progress_file=self._progress_file(n),
        )
        marker = f"attempt {n}"
        if restart_cause:
            marker += f" · previous attempt died: {restart_cause}"
        marker += f" · resuming from {resume_from}" if resume_from else " · starting fresh"
        if choice.skipped:  # incomplete ones are reported, never chosen, never deleted
            marker += " · skipped incomplete " + " | ".join(choice.skipped)
            self.registry.event(self.run.id, "checkpoints_skipped", {"attempt": n, "skipped": list(choice.skipped)})
        self._log_marker(marker)
        log_fd = os.open(self.run.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        log_offset = os.fstat(log_fd).st_size
        started_wall = time.time()
        memory = cgroups.create(f"trainguard-{self.run.id}-{n}", opts.memory_limit) if opts.memory_limit else None
        kernel_tail = kernel_log.KernelTail()  # opened before the job starts: none of its records are missed
        argv = job_argv(opts.command, opts.resume_arg, resume_from)
        if memory:
            # The job joins its cgroup before exec, so it allocates nothing outside it (a shell
            # rather than preexec_fn: the supervisor has threads when it serves metrics).
            argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(memory.procs), *argv]
        try:
            process = subprocess.Popen(
                argv,
                cwd=opts.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,  # its own session: no terminal's SIGHUP reaches it
            )
        finally:
            os.close(log_fd)
        # Recorded once the job runs: between a death and the next exec nothing waits on the registry.
        attempt = Attempt(
            n=n, started_at=started_wall, pid=process.pid, resumed_from=resume_from, log_offset=log_offset
        )
        if self.state is RunState.BACKOFF:
            self._transition(RunState.STARTING)
        self.registry.start_attempt(self.run.id, attempt)
        self._transition(RunState.RUNNING, f"attempt {n}", pid=process.pid)

        return self._conclude(process, attempt, error_file, memory, kernel_tail)

    def _adopt_attempt(self, attempt: Attempt) -> tuple[Outcome, Attempt]:
        self._log_marker(f"attempt {attempt.n} (pid {attempt.pid}) taken back under watch")
        self.registry.event(self.run.id, "adopted", {"n": attempt.n, "pid": attempt.pid})
        if self.state is not RunState.RUNNING:
            self._transition(RunState.RUNNING, f"attempt {attempt.n} adopted", pid=attempt.pid)
        error_file = os.path.join(self.run.run_dir, f"attempt-{attempt.n}.error.json")
        # No tail: the records of an adopted job's death may predate the adoption; read the whole log.
        return self._conclude(_AdoptedProcess(attempt.pid or 0), attempt, error_file, None, None)

    def _conclude(
        self,
        process: Any,
        attempt: Attempt,
        error_file: str,
        memory: cgroups.MemoryCgroup | None,
        kernel_tail: kernel_log.KernelTail | None,
    ) -> tuple[Outcome, Attempt]:
        """Watch the attempt to its end, name the death, and sum it up for the policy."""
        opts = self.options
        n, resume_from, log_offset = attempt.n, attempt.resumed_from, attempt.log_offset
        started_wall = attempt.started_at
        watch = _AttemptWatch(process, self.clock(), log_offset, resume_from, {process.pid})
        watch.kernel = kernel_tail
        watch.last_progress_mono = watch.started_mono
        watch.last_log_size = log_offset
        watch.last_checkpoint = resume_from
        returncode = self._watch(watch, n)
        stopped = self.stop_requested is not None and not watch.hung

        status = ExitStatus.from_number(returncode) if returncode not in (None, EXIT_UNKNOWN) else None
        attempt.ended_at = time.time()
        attempt.exit_code = status.code if status else None
        attempt.signal = status.signal if status else None
        new_checkpoint = find_resume(opts.checkpoint_dir, opts.checkpoint_glob, layout=opts.checkpoint_layout,
                                     settle_s=0) not in (None, resume_from)  # fmt: skip
        new_lines = self._count_lines(log_offset)
        oom_kills = memory.oom_kills() if memory else 0
        if memory:
            memory.remove()
        stopped_itself = self._stopped_on_signal(n) if returncode == 0 and not stopped else None
        if (returncode == 0 and stopped_itself is None) or stopped:
            attempt.cause = None
        else:
            extra = [stopped_itself] if stopped_itself else []
            diagnosis = self._diagnose(watch, status, started_wall, attempt.ended_at, error_file, oom_kills, extra)
            attempt.cause = diagnosis["cause"]
            attempt.confidence = diagnosis["confidence"]
            attempt.diagnosis = diagnosis
        if watch.kernel is not None:
            watch.kernel.close()
        self.registry.end_attempt(self.run.id, attempt)
        outcome = Outcome(
            exit_code=attempt.exit_code,
            signal=attempt.signal,
            cause=attempt.cause,
            stopped_by_user=stopped,
            new_checkpoint=new_checkpoint,
            new_lines=new_lines,
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

    def _watch(self, watch: _AttemptWatch, n: int) -> int:
        try:
            watch.pidfd = os.pidfd_open(watch.process.pid)
        except (AttributeError, OSError):
            watch.pidfd = None  # an old kernel: poll every tick instead
        try:
            return self._watch_loop(watch, n)
        finally:
            if watch.pidfd is not None:
                os.close(watch.pidfd)

    def _watch_loop(self, watch: _AttemptWatch, n: int) -> int:
        next_tree_sample = self.clock()
        while True:
            returncode = watch.process.poll()
            if returncode is not None:
                return returncode
            now = self.clock()
            if self.stop_requested is not None and self.state is not RunState.STOPPING:
                self._transition(RunState.STOPPING, f"signal {self.stop_requested}")
                return self._stop_group(watch)
            if now >= next_tree_sample:
                watch.pids |= _descendants(watch.process.pid)
                next_tree_sample = now + TREE_SAMPLE_S
                self._check_progress(watch, now)
                self.monitor.tick(watch.process.pid)
                if self.options.hang_timeout_s and now - watch.last_progress_mono >= self.options.hang_timeout_s:
                    watch.hung = True
                    self._dump_stacks(watch, n)
                    silent = now - watch.last_progress_mono
                    self.registry.event(self.run.id, "hang", {"attempt": n, "silent_s": silent})
                    self.monitor.alert(
                        "hang",
                        "critical",
                        en=f"attempt {n}: no progress for {silent:.0f} s; restarting",
                        zh=f"第 {n} 次尝试：{silent:.0f} 秒没有进展；正在重启",
                    )
                    return self._stop_group(watch)
            self._wait_for_exit(watch, max(0.0, next_tree_sample - self.clock()))

    def _newest_checkpoint(self) -> str | None:
        opts = self.options
        return find_resume(opts.checkpoint_dir, opts.checkpoint_glob, layout=opts.checkpoint_layout, settle_s=0)

    def _checkpoint_bytes(self) -> int | None:
        newest = self._newest_checkpoint()
        if newest is None:
            return None
        path = Path(newest)
        try:
            return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size
        except OSError:
            return None

    def _check_progress(self, watch: _AttemptWatch, now: float) -> None:
        try:
            size = os.path.getsize(self.run.log_path)
        except OSError:
            size = watch.last_log_size
        latest = self._newest_checkpoint()
        if size != watch.last_log_size or latest != watch.last_checkpoint:
            watch.last_log_size = size
            watch.last_checkpoint = latest
            watch.last_progress_mono = now

    def _stop_group(self, watch: _AttemptWatch) -> int:
        """Stop signal to the job's process group, the grace period for a checkpoint, then SIGKILL."""
        pgid = watch.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, self.options.stop_signal)
        deadline = self.clock() + self.options.grace_s
        while self.clock() < deadline:
            returncode = watch.process.poll()
            if returncode is not None:
                break
            self.sleep(POLL_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # what is left of the group (workers, writers) goes too
        return watch.process.wait()

    def _dump_stacks(self, watch: _AttemptWatch, n: int) -> None:
        target = Path(self.run.run_dir) / f"hang-attempt-{n}.txt"
        py_spy = shutil.which("py-spy")
        if py_spy is None:
            target.write_text("py-spy is not installed (pip install py-spy): no stacks could be dumped\n")
            self._log_marker(f"no progress for {self.options.hang_timeout_s:g} s; py-spy not installed, no stacks")
            return
        with open(target, "w", encoding="utf-8") as out:
            for pid in sorted(watch.pids):
                out.write(f"--- process {pid} ---\n")
                out.flush()
                subprocess.run([py_spy, "dump", "--pid", str(pid)], stdout=out, stderr=subprocess.STDOUT,
                               timeout=30, check=False)  # fmt: skip
        self._log_marker(f"no progress for {self.options.hang_timeout_s:g} s; stacks in {target}")

    # ------------------------------------------------------------------ after a death
    def _count_lines(self, offset: int, enough: int = STARTUP_LINES + 1) -> int:
        """New lines since ``offset``, counted only as far as the crash-loop guard needs to know."""
        count = 0
        with open(self.run.log_path, "rb") as log:
            log.seek(offset)
            for block in read_blocks(log, 64 * 1024):
                count += block.count(b"\n")
                if count >= enough:
                    break
        return count

    def _progress_file(self, n: int) -> str:
        return os.path.join(self.run.run_dir, f"attempt-{n}.progress.json")

    def _stopped_on_signal(self, n: int) -> Observation | None:
        """A job that saved and left its loop because a signal asked it to (a scheduler's SIGTERM, a
        pre-timeout SIGUSR1) exits 0, but its training is not finished: that attempt was preempted."""
        record = progress.read(self._progress_file(n))
        signum = record.get("stop_signal")
        if not signum:
            return None
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        at_step = f" at step {record['step']}" if record.get("step") is not None else ""
        return Observation(
            source="telemetry",
            cause="preempted",
            weight=0.95,
            role=Role.ROOT,
            rule="progress:stopped_on_signal",
            text=f"the job received {name}, saved{at_step} and stopped by itself (exit 0): it was asked to stop "
            "from outside trainguard",
        )

    def _diagnose(
        self,
        watch: _AttemptWatch,
        status: ExitStatus | None,
        started: float,
        ended: float,
        error_file: str,
        oom_kills: int,
        extra: list[Observation] | None = None,
    ) -> dict:
        extra = self.monitor.evidence(ended) + (extra or [])
        if oom_kills:
            limit = self.options.memory_limit / 1024**3
            extra.append(
                Observation(
                    source="telemetry",
                    cause="host_oom",
                    weight=0.99,
                    role=Role.ROOT,
                    rule="cgroup:oom_kill",
                    text=f"the kernel OOM-killed {oom_kills} process(es) in the job's memory cgroup "
                    f"({limit:.2f} GiB limit)",
                )
            )
        report = attempt_report(
            self.run.log_path,
            log_start=watch.log_offset,
            log_end=None,
            exit_status=None if watch.hung else status,
            started=started,
            ended=ended,
            pids=watch.pids,
            error_file=error_file,
            hang_timeout_s=self.options.hang_timeout_s if watch.hung else None,
            extra=extra,
            kernel_tail=watch.kernel,
        )
        return diagnosis_dict(report.diagnosis, "en")


def _descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()
