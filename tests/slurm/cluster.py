"""A real single-node Slurm cluster on this machine, for the tests: Debian's slurm-wlm and munge,
munged as the munge user, ``slurmctld -D -c`` and ``slurmd -D`` on ports of their own, everything
(key, sockets, state, spool, logs) in one temporary folder that is removed afterwards.

The configuration keeps what a requeue test needs fast: ``AuthInfo=cred_expire=10`` and
``SchedulerParameters=sched_interval=2,bf_interval=2`` (with the defaults a requeued job waits about
121 s before it may start again), ``JobRequeue=1``, no accounting, and process tracking and task
plugins that need no cgroup set-up (``proctrack/linuxproc``, ``task/none``). Jobs go to the default
partition ``debug``; a job in ``urgent`` (a higher priority tier) preempts them (``PreemptMode=CANCEL``
with a grace time, as clusters with preemptible partitions do).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.real.runs import free_port as _free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sinfo", "scancel")
START_TIMEOUT_S = 30.0


def why_not_available() -> str | None:
    """Why a local Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd runs jobs as their user, munged as munge)"
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "there is no munge user (apt-get install munge creates it)"
    return None


class LocalSlurm:
    """``start()``, then ``sbatch`` / ``job`` / ``wait_for_job``; ``stop()`` ends every job and daemon
    it started and removes its folder."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="trainguard-slurm-"))
        self.root.chmod(0o755)  # munged (the munge user) reaches its folder below
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self._daemons: list[subprocess.Popen] = []
        self.started_in_s: float | None = None
        self.cpus = os.cpu_count() or 1

    # ------------------------------------------------------------------ life
    def start(self) -> LocalSlurm:
        began = time.monotonic()
        try:
            self._start_munge()
            self._write_conf()
            logs = self.root / "log"
            logs.mkdir()
            for argv, name in (
                (["slurmctld", "-D", "-c", "-f", str(self.conf)], "slurmctld"),
                (["slurmd", "-D", "-f", str(self.conf), "-N", self.node], "slurmd"),
            ):
                with open(logs / f"{name}.out", "wb") as out:
                    self._daemons.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                          stdin=subprocess.DEVNULL, env=self.env()))  # fmt: skip
            self._wait_until(lambda: self._node_states() <= {"idle", "mixed", "allocated"}, "the node to be idle")
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - began
        return self

    def _start_munge(self) -> None:
        munge_dir = self.munge_socket.parent
        munge_dir.mkdir(mode=0o755)
        user = pwd.getpwnam("munge")
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for path in (munge_dir, key):
            os.chown(path, user.pw_uid, user.pw_gid)
        argv = ["munged", "--foreground", f"--key-file={key}", f"--socket={self.munge_socket}",
                f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={munge_dir / 'munged.log'}",
                f"--seed-file={munge_dir / 'munged.seed'}"]  # fmt: skip
        self._daemons.append(subprocess.Popen(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))  # fmt: skip
        self._wait_until(self.munge_socket.exists, "munged's socket")

    def _write_conf(self) -> None:
        for folder in ("state", "spool"):
            (self.root / folder).mkdir()
        self.conf.write_text(
            f"""ClusterName=trainguard-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool"}
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd.pid"}
SlurmctldLogFile={self.root / "log" / "slurmctld.log"}
SlurmdLogFile={self.root / "log" / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
ReturnToService=2
SchedulerParameters=sched_interval=2,bf_interval=2
KillWait=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP GraceTime=10
PartitionName=urgent Nodes={self.node} PriorityTier=2 MaxTime=INFINITE State=UP PreemptMode=OFF
"""
        )

    def stop(self) -> None:
        """Cancel every job, let their steps end, stop the daemons (SIGTERM, then SIGKILL), remove
        the folder."""
        if self._daemons and self._daemons[-1].poll() is None:
            with contextlib.suppress(Exception):
                subprocess.run(["scancel", "--full", "--user=root"], env=self.env(), timeout=30, check=False,
                               capture_output=True)  # fmt: skip
                self._wait_until(lambda: not self.client("squeue", "-h").stdout.strip(), "the jobs to end", 60)
        for daemon in reversed(self._daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
        self._daemons.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ using it
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        for name in [n for n in env if n.startswith("SLURM_") and n != "SLURM_CONF"]:
            del env[name]  # a test run inside a Slurm job must not lend its job to these
        return env

    def client(self, *argv: str, env: dict[str, str] | None = None, cwd: str | None = None,
               timeout: float = 30) -> subprocess.CompletedProcess:  # fmt: skip
        return subprocess.run(list(argv), env=env or self.env(), cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip

    def sbatch(self, script: Path, *options: str, env: dict[str, str] | None = None) -> str:
        done = self.client("sbatch", "--parsable", *options, str(script), env=env, cwd=str(script.parent))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, Restarts, ExitCode, ...)."""
        done = self.client("scontrol", "show", "job", "-o", job_id)
        assert done.returncode == 0, done.stderr
        return dict(field.split("=", 1) for field in done.stdout.split() if "=" in field)

    def wait_for_job(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        return self._wait_until(lambda: (job := self.job(job_id))["JobState"] in states and job,
                                f"job {job_id} to be {'/'.join(states)}", timeout)  # fmt: skip

    def _node_states(self) -> set[str]:
        """The node's state in each partition (none while slurmctld does not answer yet)."""
        done = self.client("sinfo", "-h", "-N", "-o", "%T", timeout=5)
        return set(done.stdout.split()) if done.returncode == 0 and done.stdout.strip() else {"unknown"}

    def _wait_until(self, predicate, what: str, timeout: float = START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for daemon in self._daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(f"{daemon.args[0]} exited ({daemon.returncode}) while waiting for {what}; "
                                       f"logs in {self.root / 'log'}")  # fmt: skip
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
