"""Watching one attempt's job until it exits or has to be stopped: what is learnt of the job while it
runs (its processes, a launcher's ranks, when it was last active), the tick loop that passes save
requests on and notices a hang or other nodes that never came, and stopping the job.

The loop never changes the run's state: it says why it ended (``WatchEnd``), and the supervisor
acts on that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psutil

from trainguard._i18n import Text
from trainguard._proc import ProcessRef, catches_signal
from trainguard.monitor.runwatch import RunMonitor
from trainguard.probes import kernel_log
from trainguard.store.journal import Journal
from trainguard.store.registry import Attempt
from trainguard.supervisor import launchers
from trainguard.supervisor.attempt_files import append_marker
from trainguard.supervisor.containment import Containment, stop_gracefully
from trainguard.supervisor.foresight import Foresight
from trainguard.supervisor.log_keeper import RunLogs
from trainguard.supervisor.progress_tracking import ProgressTracker
from trainguard.supervisor.signals import SignalInbox
from trainguard.supervisor.stacks import dump_stacks

POLL_S = 0.1
TICK_S = 1.0  # how often the job's tree, progress, samples and the registry queue are looked at

EXIT_UNKNOWN = -(1 << 16)  # an adopted job is not our child: its exit status cannot be had


class AdoptedProcess:
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
class AttemptWatch:
    """What the supervisor learns while one attempt runs."""

    process: Any  # subprocess.Popen or AdoptedProcess
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
    returncode: int | None = None  # the job's exit status, once it exited by itself
    kernel: kernel_log.KernelTail | None = None
    pids: set[int] = field(default_factory=set)
    launch_record: dict[str, Any] | None = None  # the job runs under a launcher: what is known of its ranks
    workers: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (rank, local rank)
    foresight: Foresight | None = None  # acts on deaths seen coming (not for an adopted job)

    @classmethod
    def of_adopted(cls, attempt: Attempt, clock: Callable[[], float]) -> AttemptWatch:
        """The watch of a job whose supervisor died. No kernel tail: the records of an adopted job's
        death may predate the adoption."""
        job = ProcessRef(attempt.pid or 0, attempt.pid_start)
        containment = Containment.from_record(attempt.containment, job)
        if containment.groups is not None:
            containment.groups.thaw()  # its supervisor may have died with the job paused for a log rotation
        read_fd = None
        if attempt.log_path:
            with contextlib.suppress(OSError):
                read_fd = os.open(attempt.log_path, os.O_RDONLY | os.O_CLOEXEC)
        return cls(AdoptedProcess(job), attempt, containment, read_fd, clock())

    @property
    def log_path(self) -> str | None:
        return f"/proc/self/fd/{self.log_fd}" if self.log_fd is not None else None

    def log_size(self) -> int:
        if self.log_fd is None:
            return 0
        try:
            return os.fstat(self.log_fd).st_size
        except OSError:
            return 0

    def last_active(self, clock: Callable[[], float], logged_at: float | None = None) -> float:
        """When the job was last seen active, wall time: its last output (``logged_at``, where the log
        keeper knows it, else the log's modification time), else the supervisor's last sight of
        progress (output, a checkpoint, a step)."""
        ended = self.attempt.ended_at or time.time()
        if self.silent_since is not None:
            return min(ended, self.silent_since)
        if logged_at is not None:
            return min(ended, logged_at)
        if self.log_fd is not None:
            with contextlib.suppress(OSError):
                return min(ended, os.fstat(self.log_fd).st_mtime)
        return ended - max(0.0, clock() - self.last_progress_mono)

    def learn_workers(self) -> None:
        """Which process is which rank (from its environment), learnt while they live: the stack
        dumps and the diagnosis name ranks, not pids."""
        if self.launch_record is None:
            return
        for pid in self.pids - self.workers.keys():
            identity = launchers.worker_identity(pid)
            self.workers[pid] = identity if identity is not None else (-1, -1)

    def waiting_for_peers(self) -> bool:
        """A launcher's job across nodes whose workers have not started: its rendezvous waits for
        the other nodes (torchrun starts the workers once every node has joined)."""
        record = self.launch_record
        if record is None or not record.get("multi_node"):
            return False
        return not any(rank >= 0 for rank, _local in self.workers.values())

    def save_launch_record(self, run_dir: str) -> None:
        if self.launch_record is None:
            return
        self.launch_record["workers"] = {
            str(pid): {"rank": rank, "local_rank": local} for pid, (rank, local) in self.workers.items() if rank >= 0
        }
        launchers.write_record(launchers.record_path(run_dir, self.attempt.n), self.launch_record)

    def stop_job(
        self, stop_signal: int, grace_s: float, *, clock: Callable[[], float], sleep: Callable[[float], None]
    ) -> int:
        if self.containment.job is None:
            self.containment.job = ProcessRef(self.process.pid)
        stop_gracefully(
            self.containment,
            stop_signal,
            grace_s,
            job_exited=lambda: self.process.poll() is not None,
            clock=clock,
            sleep=sleep,
        )
        return self.process.wait()

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
        if self.log_fd is not None:
            os.close(self.log_fd)


class WatchEnd(Enum):
    """Why the watch of a job ended: it exited (its status is the watch's ``returncode``), or it has
    to be stopped. A reason the watch itself found names the event and the alert it raised."""

    EXITED = "exited"
    STOP_REQUESTED = "stop_requested"  # a stop signal: the run stops
    PEERS_MISSING = "peers_missing"  # the other nodes never joined the launcher's rendezvous
    HUNG = "hang"  # no progress for --hang-timeout


@dataclass(kw_only=True)
class JobWatch:
    """The tick loop over a running job: every tick the job's process tree, its progress, the
    samples and the registry queue are looked at; between ticks a pidfd wakes the loop the moment
    the job exits, and the wakeup pipe when a signal comes."""

    signals: SignalInbox
    tracker: ProgressTracker
    monitor: RunMonitor
    journal: Journal
    run_dir: str
    hang_timeout_s: float | None
    peer_timeout_s: float | None
    housekeeping: Callable[[], None]  # the supervisor's, once a tick
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    logs: RunLogs | None = None  # keeps the run's logs within their bound

    def follow(self, watch: AttemptWatch) -> WatchEnd:
        """Watch the job until it exits or has to be stopped; the stop is the caller's to make."""
        try:
            watch.pidfd = os.pidfd_open(watch.process.pid)
        except (AttributeError, OSError):
            watch.pidfd = None  # an old kernel, or the job is already gone: poll every tick instead
        try:
            return self._loop(watch)
        finally:
            if watch.pidfd is not None:
                os.close(watch.pidfd)

    def _loop(self, watch: AttemptWatch) -> WatchEnd:
        next_tick = logs_due = self.clock()
        n = watch.attempt.n
        signals = self.signals
        while True:
            watch.returncode = watch.process.poll()
            if watch.returncode is not None:
                return WatchEnd.EXITED
            now = self.clock()
            if watch.foresight is not None:
                watch.foresight.tick(now)
            if signals.save_requested is not None and (signals.save_request_new or now >= next_tick):
                self._pass_on_save_request(watch, signals.save_requested)
            if signals.stop_requested is not None:
                return WatchEnd.STOP_REQUESTED
            if self.logs is not None and now >= logs_due:  # a fast writer's log is looked at sooner than a tick
                self.logs.tick(watch)
                logs_due = now + self.logs.poll_in()
            if now >= next_tick:
                next_tick = now + TICK_S
                self.housekeeping()
                watch.pids |= _descendants(watch.process.pid)
                watch.learn_workers()
                self.tracker.check_progress(watch, now)
                self.monitor.tick(watch.process.pid)
                if watch.waiting_for_peers():
                    watch.last_progress_mono = now  # waiting for the other nodes is not a hang
                    if self.peer_timeout_s and now - watch.started_mono >= self.peer_timeout_s:
                        watch.peers_missing = True
                        return self._must_stop(
                            WatchEnd.PEERS_MISSING,
                            {"attempt": n, "waited_s": now - watch.started_mono},
                            en=f"attempt {n}: the other nodes did not join in {self.peer_timeout_s:g} s",
                            zh=f"第 {n} 次尝试：其他节点 {self.peer_timeout_s:g} 秒内没有加入",
                        )
                if self.hang_timeout_s and now - watch.last_progress_mono >= self.hang_timeout_s:
                    watch.hung = True
                    watch.silent_since = watch.last_active(self.clock, self.last_written(watch))  # before markers
                    dump_stacks(watch, self.run_dir, self.hang_timeout_s)
                    silent = now - watch.last_progress_mono
                    return self._must_stop(
                        WatchEnd.HUNG,
                        {"attempt": n, "silent_s": silent},
                        en=f"attempt {n}: no progress for {silent:.0f} s; restarting",
                        zh=f"第 {n} 次尝试：{silent:.0f} 秒没有进展；正在重启",
                    )
            wake = min(next_tick, logs_due) if self.logs is not None else next_tick
            if watch.foresight is not None:
                wake = min(wake, now + watch.foresight.due_in(now))
            self._wait_for_exit(watch, max(0.0, wake - self.clock()))

    def last_written(self, watch: AttemptWatch) -> float | None:
        """When the job last wrote to its log, where the log keeper follows it."""
        return self.logs.last_written(watch.attempt.n) if self.logs is not None else None

    def _must_stop(self, end: WatchEnd, data: dict[str, Any], *, en: str, zh: str) -> WatchEnd:
        """Why the job has to be stopped, recorded as an event and raised as a critical alert of the
        same name."""
        self.journal.event(end.value, data)
        self.monitor.alert(end.value, "critical", en=en, zh=zh)
        return end

    def _wait_for_exit(self, watch: AttemptWatch, timeout_s: float) -> None:
        """Sleep until the job exits, a signal arrives, or the timeout passes: a pidfd makes the
        job's death wake the supervisor at once, so a restart does not wait for a polling tick."""
        if watch.pidfd is None:
            self.sleep(min(POLL_S, timeout_s))
            return
        self.signals.wait(watch.pidfd, timeout_s)

    def _pass_on_save_request(self, watch: AttemptWatch, signum: int) -> None:
        """A save request (SIGUSR1) goes to the job's processes that handle it (the Checkpointer and
        the framework callbacks install a handler), never to the others: a DataLoader worker or a
        launcher without a handler would be killed by it. The run goes on; the job saves and leaves.
        While no process handles it yet (the job is still importing its libraries), the request waits
        and is tried again every tick."""
        name = signal.Signals(signum).name
        pids = sorted(watch.containment.pids() | {watch.process.pid})
        passed = [pid for pid in pids if catches_signal(pid, signum) and ProcessRef.of(pid).signal(signum)]
        noted_before = not self.signals.save_request_new
        self.signals.save_request_new = False
        if passed:
            self.signals.save_requested = None
            self.journal.event("save_requested", {"attempt": watch.attempt.n, "signal": signum, "passed_to": passed})
            listed = ", ".join(map(str, passed))
            append_marker(watch.attempt.log_path, Text(f"{name}: a save request, passed on to process(es) {listed}",
                                                       f"{name}：保存请求，已转发给进程 {listed}"))  # fmt: skip
        elif not noted_before:
            self.journal.event("save_request_waiting", {"attempt": watch.attempt.n, "signal": signum})
            append_marker(watch.attempt.log_path, Text(
                f"{name}: a save request, but no process of the job handles {name} yet (trainguard's Checkpointer "
                "does): passed on once one does",
                f"{name}：保存请求，但作业中还没有进程处理 {name}（trainguard 的 Checkpointer 会处理）："
                "有进程处理后再转发"))


def _descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()
