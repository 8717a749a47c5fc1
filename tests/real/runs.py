"""Driving the real `trainguard` command from tests: run it, read a run's status, wait for a state."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path


def tg(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, **kwargs)  # fmt: skip


def status(ref: str) -> dict:
    done = tg("status", ref, "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def run_id_from(output: str) -> str:
    return output.split("started run ", 1)[1].split()[0]


TICKER = """
    import time
    for step in range(100_000):
        print("step", step, flush=True)
        time.sleep(0.05)
"""


def kill_group(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel picks it), for a server or rendezvous a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
