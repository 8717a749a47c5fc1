"""A user without root gets the right verdict: the kernel log is unreadable to them here
(kernel.dmesg_restrict=1, as on most shared servers and in containers), so a plain `kill -9` of the
job was read as "host RAM exhausted" 0.50. The OOM counters of the machine and of the job's memory
cgroup, readable by anyone, now decide it: no OOM kill during the attempt is `killed`; an OOM kill
inside the memory limit the job runs under (a container's --memory) is `host_oom` for certain.
Real users, a real SIGKILL, a real memory cgroup and a real OOM kill."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.users import as_user, skip_unless_runnable, user_named
from tests.real.runs import wait_for

pytestmark = [pytest.mark.real, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")]


def _status(user, shared: Path, home: Path, run: str) -> dict:
    done = as_user(user, shared, home, "status", run, "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def _kernel_log_closed_to(user, shared: Path) -> None:
    probe = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "dmesg"],
                           capture_output=True, check=False)  # fmt: skip
    if probe.returncode == 0:
        pytest.skip("this machine lets users read the kernel log (kernel.dmesg_restrict=0): nothing to prove here")


def _bob_without_the_kernel_log(shared: Path):
    """A second user who can run trainguard here and cannot read the kernel log, and his state folder."""
    bob = user_named("tg-bob")
    skip_unless_runnable(bob, shared)
    _kernel_log_closed_to(bob, shared)
    return bob, _sticky(shared) / "bob-state"


def test_a_kill_9_of_a_non_root_user_s_job_is_killed_not_host_oom(shared: Path) -> None:
    bob, home = _bob_without_the_kernel_log(shared)
    own_home = shared / "home-tg-bob"
    env = dict(os.environ, TRAINGUARD_HOME=str(home), PYTHONPATH=str(shared / "src"), HOME=str(own_home))
    # In the foreground: the supervisor is this process (a detached one would be started from a Python
    # that may sit under root's home, out of this user's reach).
    runner = subprocess.Popen(["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}", "--clear-groups",
                               sys.executable, "-m", "trainguard", "run", "--foreground", "--name", "victim",
                               "--max-restarts", "0", "--", "sleep", "300"], env=env, cwd=shared,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        pid = wait_for(lambda: _status(bob, shared, home, "victim").get("pid")
                       if (home / "runs.sqlite").exists() else None, what="the job's pid")  # fmt: skip
        time.sleep(1)
        os.kill(pid, signal.SIGKILL)
        runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    attempt = _status(bob, shared, home, "victim")["attempts"][0]
    assert attempt["cause"] == "killed", (attempt, runner.stderr.read()[-1000:])


def _sticky(shared: Path) -> Path:
    """A folder like /tmp: anyone may make a folder of their own in it, nobody may take another's."""
    folder = shared / "sticky"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o1777)
    return folder


def _any_users_python() -> str:
    """A Python every user may run as the job (the test's own may sit under root's home)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        if os.path.exists(candidate) and os.stat(candidate).st_mode & 0o001:
            return candidate
    pytest.skip("no Python that every user may run")


def _memory_cgroup(limit: int) -> Path:
    name = f"tg-test-{secrets.token_hex(3)}"
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists():
        group = v1 / name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(OSError):
            (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        return group
    v2 = Path("/sys/fs/cgroup")
    if "memory" in (v2 / "cgroup.controllers").read_text().split() if (v2 / "cgroup.controllers").exists() else []:
        group = v2 / name
        group.mkdir()
        (group / "memory.max").write_text(str(limit))
        (group / "memory.swap.max").write_text("0")
        return group
    pytest.skip("no memory cgroup controller to make a limit with")


def test_an_oom_kill_inside_a_non_root_user_s_memory_limit_is_host_oom(shared: Path) -> None:
    bob, home = _bob_without_the_kernel_log(shared)
    group = _memory_cgroup(300 * 1024 * 1024)  # as a container's --memory would be: bob's whole session in it
    hog = "a = []\nwhile True:\n    a.append(bytearray(16 * 1024 * 1024))\n"
    job = shared / "hog.py"
    job.write_text(hog)
    job.chmod(0o644)
    try:
        inner = " ".join(["setpriv", f"--reuid={bob.pw_uid}", f"--regid={bob.pw_gid}", "--clear-groups", sys.executable,
                          "-m", "trainguard", "run", "--foreground", "--max-restarts", "0", "--", _any_users_python(),
                          str(job)])  # fmt: skip
        env = dict(os.environ, TRAINGUARD_HOME=str(home), PYTHONPATH=str(shared / "src"), HOME=str(shared))
        done = subprocess.run(["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec {inner}'], env=env, cwd=shared,
                              capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
        assert done.returncode == 75, (done.returncode, done.stderr[-2000:])
        runs = json.loads(as_user(bob, shared, home, "ps", "--json").stdout)
        attempt = runs[0]["attempts"][0]
        assert attempt["cause"] == "host_oom" and attempt["confidence"] >= 0.99, attempt
    finally:
        for _ in range(50):
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)
