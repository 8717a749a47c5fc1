"""Nothing the job started outlives its attempt: forked children, double-forked daemons, with and
without --memory-limit, after a death, a stop or a restart; the attempts' cgroups are removed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.chaos.conftest import alive, cgroups_of
from tests.real import faults
from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real

FORKER = """
    import os, sys, time
    pids = []
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        pids.append(pid)
    open(sys.argv[1], "w").write(" ".join(map(str, pids)))
    sys.exit(1)
"""

DAEMON = """
    import os, sys, time
    if os.fork() == 0:          # the classic double fork: the grandchild leaves the session
        os.setsid()
        if os.fork() == 0:
            open(sys.argv[1], "w").write(str(os.getpid()))
            time.sleep(600)
            os._exit(0)
        os._exit(0)
    while True:
        print("training", flush=True)
        time.sleep(0.2)
"""


def _pids(path: Path) -> list[int]:
    return [int(p) for p in wait_for(lambda: path.exists() and path.read_text().split(), what=str(path))]


def test_children_of_a_failed_attempt_are_killed_when_it_ends(tmp_path: Path, home: Path) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"cgroups: {reason}")
    record = tmp_path / "children"
    done = tg("run", "--foreground", "--restart", "never", "--", sys.executable, script(tmp_path, "f.py", FORKER),
              str(record))  # fmt: skip
    assert done.returncode != 0
    children = _pids(record)
    assert len(children) == 200
    survivors = [pid for pid in children if alive(pid)]
    assert survivors == [], f"{len(survivors)} children outlived the run"
    run = status(run_id_from_ps())
    assert run["state"] == "failed" and run["containment"].startswith("cgroup")
    assert cgroups_of(run["id"]) == []


def run_id_from_ps() -> str:
    import json

    return json.loads(tg("ps", "--json").stdout)[0]["id"]


@pytest.mark.parametrize("limit", [None, "512M"])
def test_a_double_forked_daemon_does_not_survive_stop(tmp_path: Path, home: Path, limit: str | None) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"cgroups: {reason}")
    record = tmp_path / "daemon"
    extra = ["--memory-limit", limit] if limit else []
    run_id = run_id_from(tg("run", *extra, "--", sys.executable, script(tmp_path, "d.py", DAEMON), str(record)).stdout)
    (daemon,) = _pids(record)
    assert alive(daemon)
    assert cgroups_of(run_id), "the attempt runs in cgroups of its own"
    assert tg("stop", run_id, "--grace", "2s").returncode == 0
    wait_for(lambda: not alive(daemon), timeout=5, what="the daemon to die")
    assert cgroups_of(run_id) == []


def test_leftovers_of_a_dead_attempt_are_gone_before_the_restart(tmp_path: Path, home: Path) -> None:
    """A job that dies leaving a child holding a port: the next attempt must find the port free."""
    if reason := faults.why_no_root():
        pytest.skip(f"cgroups: {reason}")
    job = script(tmp_path, "port.py", """
        import os, socket, sys, time
        attempt = os.environ["TRAINGUARD_ATTEMPT"]
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        server.bind(("127.0.0.1", int(sys.argv[1])))
        server.listen()
        print("attempt", attempt, "listening", flush=True)
        if attempt == "1":
            if os.fork() == 0:      # a worker that inherits the socket and outlives its parent
                time.sleep(600)
            os._exit(3)
        print("finished", flush=True)
    """)  # fmt: skip
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = tg("run", "--foreground", "--retry", "unknown=yes", "--", sys.executable, job, str(port))
    assert done.returncode == 0, done.stderr
    out = tg("logs", run_id_from_ps()).stdout
    assert "attempt 2 listening" in out and "finished" in out


def test_without_cgroups_containment_is_partial_and_says_so(tmp_path: Path, home: Path) -> None:
    """Where no cgroup can be made (a container without cgroup access: here a mount namespace whose
    /sys/fs/cgroup is an empty tmpfs), a double-forked daemon is still found (the supervisor is a
    child subreaper) and killed by `stop`, and `status` says that containment is partial."""
    if reason := faults.why_no_mount_namespace():
        pytest.skip(reason)
    record = tmp_path / "daemon"
    hide_cgroups = 'mount --make-rprivate / && mount -t tmpfs none /sys/fs/cgroup && exec "$@"'
    import subprocess

    started = subprocess.run(["unshare", "-m", "sh", "-c", hide_cgroups, "no-cgroups", sys.executable, "-m",
                              "trainguard", "run", "--", sys.executable, script(tmp_path, "d.py", DAEMON), str(record)],
                             capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    (daemon,) = _pids(record)
    assert "containment is partial" in tg("status", run_id).stdout
    assert status(run_id)["containment"].startswith("partial")
    assert tg("stop", run_id, "--grace", "2s").returncode == 0
    wait_for(lambda: not alive(daemon), timeout=5, what="the daemon to die")
