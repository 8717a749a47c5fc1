"""Nothing a job starts outlives its attempt: every attempt runs in cgroups of its own (with or without
``--memory-limit``), and when it ends everything left in them is killed before the next attempt
starts (leftover workers hold GPU memory and ports). Where cgroups cannot be made (not root), the
fallback is the job's session and process group, and the supervisor as a child subreaper so that
double-forked descendants come back to it; ``status`` then says that containment is partial.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from trainguard._proc import ProcessRef, catches_signal, session_members, start_time
from trainguard.probes import cgroups
from trainguard.supervisor import launchers

PR_SET_CHILD_SUBREAPER = 36
KILL_TIMEOUT_S = 10.0


def become_subreaper() -> bool:
    """Orphaned descendants of the job are re-parented to this process, not to init: it can still
    find and reap them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _own_descendants(exclude: set[int]) -> list[ProcessRef]:
    """The live descendants: psutil lists zombies too, and a zombie re-parented here is dead (killing
    it again and again until a timeout held every stop and every death for 10 s)."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    refs = (ProcessRef(c.pid, start_time(c.pid)) for c in children if c.pid not in exclude)
    return [ref for ref in refs if ref.alive()]


@dataclass
class Containment:
    """The processes of one attempt. ``job`` is the process the supervisor started (or adopted); its
    session id is its pid (the supervisor starts it with setsid)."""

    job: ProcessRef | None = None
    groups: cgroups.JobCgroups | None = None
    partial_reason: str | None = None
    subreaper: bool = False
    helpers: set[int] = field(default_factory=set)  # the supervisor's own children that are not the job's

    @property
    def description(self) -> str:
        if self.groups is not None:
            return self.groups.description
        return f"partial ({self.partial_reason})"

    @property
    def complete(self) -> bool:
        return self.groups is not None

    def join_argv(self, argv: list[str]) -> list[str]:
        """The command wrapped so that it enters its cgroups before it runs (a shell rather than
        preexec_fn: the supervisor has threads when it serves metrics)."""
        if self.groups is None:
            return argv
        procs = [str(g.procs) for g in self.groups.groups]
        script = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; shift ' + str(len(procs) + 1)
        return ["/bin/sh", "-c", script + '; exec "$@"', "trainguard-join", *procs, "--", *argv]

    def pids(self) -> set[int]:
        if self.groups is not None:
            return self.groups.pids()
        return {ref.pid for ref in self._fallback_members()}

    def _fallback_members(self) -> list[ProcessRef]:
        members: dict[int, ProcessRef] = {}
        if self.job is not None:
            if self.job.alive():
                members[self.job.pid] = self.job
            for ref in session_members(self.job.pid, not_before=self.job.start):
                members[ref.pid] = ref
        if self.subreaper:
            exclude = set(self.helpers) | ({self.job.pid} if self.job else set())
            for ref in _own_descendants(exclude):
                members[ref.pid] = ref
        return list(members.values())

    def kill_all(self, timeout_s: float = KILL_TIMEOUT_S) -> int:
        """SIGKILL everything left of the attempt and wait until it is gone."""
        if self.groups is not None:
            killed = self.groups.kill_all(timeout_s)
        else:
            killed = 0
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                self._reap_orphans()
                members = self._fallback_members()
                if not members:
                    break
                killed += sum(ref.signal(signal.SIGKILL) for ref in members)
                time.sleep(0.02)
        self._reap_orphans()
        return killed

    def _reap_orphans(self) -> None:
        """Collect the zombies of descendants that were re-parented here (never the job: its
        Popen reaps it and needs its exit status)."""
        if not self.subreaper:
            return
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process().children():
                if child.pid in self.helpers or (self.job and child.pid == self.job.pid):
                    continue
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(child.pid, os.WNOHANG)

    def remove(self) -> None:
        if self.groups is not None:
            self.groups.remove()

    def to_record(self) -> dict[str, object]:
        record: dict[str, object] = {"description": self.description}
        if self.groups is not None:
            record["cgroups"] = self.groups.to_record()
        return record

    @classmethod
    def from_record(cls, record: dict[str, object] | None, job: ProcessRef | None) -> Containment:
        """What another process (an adopting supervisor, `stop` without a supervisor) can rebuild of
        an attempt's containment from its record."""
        groups = None
        if record and record.get("cgroups"):
            groups = cgroups.JobCgroups.from_record(record["cgroups"])  # type: ignore[arg-type]
            if not any(g.exists() for g in groups.groups):
                groups = None
        reason = None if groups else "recorded process group and session only"
        return cls(job=job, groups=groups, partial_reason=reason)


def contain(name: str, memory_limit: int | None, *, subreaper: bool) -> Containment:
    """Cgroups for a new attempt, or the partial fallback with the reason. A memory limit that
    cannot be enforced is an error, not a fallback."""
    try:
        return Containment(groups=cgroups.create(name, memory_limit), subreaper=subreaper)
    except cgroups.CgroupUnavailable as exc:
        if memory_limit is not None:
            raise
        return Containment(partial_reason=f"no cgroup could be created: {exc.reason}", subreaper=subreaper)


@dataclass(frozen=True)
class _Member:
    ref: ProcessRef
    parent: int
    cmdline: tuple[str, ...]


def _members(containment: Containment) -> dict[int, _Member]:
    found = {}
    for pid in containment.pids():
        try:
            process = psutil.Process(pid)
            found[pid] = _Member(ProcessRef(pid, start_time(pid)), process.ppid(), tuple(process.cmdline()))
        except psutil.Error:
            continue
    return found


def _is_worker(member: _Member, members: dict[int, _Member]) -> bool:
    """A worker another process of the attempt started for itself (DataLoader workers, a
    multiprocessing pool): forked without exec (the parent's own command line) or started by
    multiprocessing's spawn or forkserver. It is ended by its parent, or with the rest at the end."""
    parent = members.get(member.parent)
    if parent is None:
        return False
    return member.cmdline == parent.cmdline or any("multiprocessing" in part for part in member.cmdline)


def _is_rank_main(pid: int, member: _Member) -> bool:
    """The main process of a rank under a launcher: ``RANK`` in its environment, not in its parent's."""
    return launchers.worker_identity(pid) is not None and launchers.worker_identity(member.parent) is None


def _wait(until: Callable[[], bool], deadline: float, clock: Callable[[], float], sleep: Callable[[float], None],
          poll_s: float) -> bool:  # fmt: skip
    while not until():
        if clock() >= deadline:
            return False
        sleep(poll_s)
    return True


def stop_gracefully(
    containment: Containment,
    stop_signal: int,
    grace_s: float,
    *,
    job_exited: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.1,
) -> bool:
    """Stop the job as ``docker stop``, Kubernetes and systemd's ``KillMode=mixed`` do: the stop
    signal to its main processes (the job, and what it runs: a shell script's python), never to the
    workers they started for themselves; the grace period for a last checkpoint; then SIGKILL to
    whatever is left of the attempt. A signal to the whole process group killed the DataLoader
    workers first, and the training process died in ``next(it)`` without saving. Under a launcher
    (torchrun forwards SIGTERM to each rank's whole group) each rank that handles it gets the
    save-and-stop request (SIGUSR1) first, and the launcher is told once its ranks are done.
    Whether the job's main processes ended within the grace period."""
    deadline = clock() + grace_s
    job = containment.job
    if job is not None and not job.alive():
        for member in session_members(job.pid, not_before=job.start):  # the leader is gone, its group is not
            member.signal(stop_signal)
        ended = _wait(lambda: not containment.pids(), deadline, clock, sleep, poll_s)
    elif job is not None:
        members = _members(containment)
        ranks = {pid: m.ref for pid, m in members.items() if pid != job.pid and _is_rank_main(pid, m)}
        handled = [ref for ref in ranks.values() if catches_signal(ref.pid, signal.SIGUSR1)]
        asked = [ref for ref in handled if ref.signal(signal.SIGUSR1)]
        if asked:
            _wait(lambda: job_exited() or not any(ref.alive() for ref in asked), deadline, clock, sleep, poll_s)
        members = _members(containment)
        mains = [m.ref for pid, m in members.items()
                 if pid not in ranks and (pid == job.pid or not _is_worker(m, members))]  # fmt: skip
        for ref in mains:
            ref.signal(stop_signal)
        ended = _wait(lambda: job_exited() and not any(ref.alive() for ref in mains), deadline, clock, sleep, poll_s)
    else:
        ended = _wait(lambda: job_exited() and not containment.pids(), deadline, clock, sleep, poll_s)
    containment.kill_all()
    return ended
