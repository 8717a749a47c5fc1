"""A supervisor in a session of its own: the command that starts a run spawns it and waits for its
handshake, one JSON line on a pipe once the job runs (or is watched again), or the one-line error
that stopped it; a supervisor that dies before it answers is explained from the run's record and its
log."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainguard._proc import ProcessRef
from trainguard.errors import TrainguardError, UsageError
from trainguard.paths import open_private
from trainguard.store.registry import Registry, Run
from trainguard.supervisor import lock as run_lock

HANDSHAKE_TIMEOUT_S = 120.0  # NVML start-up on a machine with many GPUs takes seconds


class Handshake:
    """The detached supervisor's answer to the command that started it: one JSON line on a pipe,
    written once the job runs (or is watched again), or the one-line error that stopped it."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def _send(self, message: dict[str, Any]) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._fd, (json.dumps(message) + "\n").encode())
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None

    def started(self, run: Run) -> None:
        self._send({"ok": True, "job_pid": run.job_pid})

    def failed(self, error: TrainguardError) -> None:
        self._send({"ok": False, "en": error.message_en, "zh": error.message_zh, "exit_code": error.exit_code})

    @property
    def pending(self) -> bool:
        return self._fd is not None



def start_detached(
    registry: Registry,
    run: Run,
    *,
    adopt: bool = False,
    restart: bool = False,
    lock: run_lock.SupervisorLock | None = None,
) -> Run:
    """Start the run's supervisor in a session of its own and wait for its handshake: back comes the
    run with its job started, or the supervisor's one-line error (raised here). ``lock``, the run's
    supervisor lock held here, goes to the supervisor with its descriptor: the run is never unheld."""
    try:
        return _start_detached(registry, run, adopt=adopt, restart=restart, lock=lock)
    finally:
        if lock is not None:
            lock.release()  # this process's copy: the supervisor's keeps the lock


def _start_detached(
    registry: Registry, run: Run, *, adopt: bool, restart: bool, lock: run_lock.SupervisorLock | None
) -> Run:
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    log_path = Path(run.run_dir) / "supervisor.log"
    try:
        log = open_private(log_path, "ab")
    except OSError:
        log = open(os.devnull, "wb")  # noqa: SIM115 - a full state disk must not stop the start
    flags = (["--adopt"] if adopt else []) + (["--restart"] if restart else [])
    if lock is not None:
        flags += ["--lock-fd", str(lock.fd), "--lock-since", repr(lock.taken_at)]
    try:
        process = _spawn_supervisor(
            [sys.executable, "-m", "trainguard.supervisor", run.id, "--handshake", str(write_fd), *flags],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=run.cwd if os.path.isdir(run.cwd) else "/",
            pass_fds=(write_fd,) if lock is None else (write_fd, lock.fd),
        )
    except OSError as exc:
        os.close(read_fd)
        raise TrainguardError(f"cannot start the supervisor ({sys.executable}): {exc.strerror}",
                              f"无法启动监督进程（{sys.executable}）：{exc.strerror}") from None  # fmt: skip
    finally:
        os.close(write_fd)
        log.close()
    try:
        message = _await_handshake(read_fd, HANDSHAKE_TIMEOUT_S)
    finally:
        os.close(read_fd)
    if message is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)  # the pipe closed as it exited: it is reaped in a moment
        if process.poll() is None:
            raise TrainguardError(
                f"the supervisor of run {run.id} has not answered in {HANDSHAKE_TIMEOUT_S:g} s; see {log_path}",
                f"运行 {run.id} 的监督进程 {HANDSHAKE_TIMEOUT_S:g} 秒内没有回应；见 {log_path}",
            )
        current = registry.get(run.id)
        if current is not None and len(current.attempts) > len(run.attempts):
            attempt = current.attempts[-1]
            if ProcessRef(attempt.pid or 0, attempt.pid_start).alive():  # the run knows it, nobody watches it
                raise TrainguardError(
                    f"the supervisor of run {run.id} died after starting its job (pid {attempt.pid}): "
                    f"`trainguard adopt {run.id}` watches the job again, `trainguard stop {run.id}` ends it",
                    f"运行 {run.id} 的监督进程在启动作业（pid {attempt.pid}）后退出："
                    f"`trainguard adopt {run.id}` 重新监督该作业，`trainguard stop {run.id}` 结束它",
                )
            raise TrainguardError(
                f"the supervisor of run {run.id} died as it started the job, which is not running: "
                f"`trainguard adopt {run.id}` records its end and goes on as the restart policy says, "
                f"`trainguard stop {run.id}` ends the run",
                f"运行 {run.id} 的监督进程在启动作业时退出，作业没有在运行："
                f"`trainguard adopt {run.id}` 记录其结束并按重启策略继续，`trainguard stop {run.id}` 结束该运行",
            )
        last = _last_line(log_path)
        raise TrainguardError(  # its log may go with a run that never started: what it said is quoted here
            f"the supervisor of run {run.id} exited while starting" + (f": {last}" if last else " without a word"),
            f"运行 {run.id} 的监督进程在启动时退出" + (f"：{last}" if last else "，没有留下任何信息"),
        )
    if not message.get("ok"):
        error = UsageError(message.get("en", "the supervisor could not start"), message.get("zh"))
        error.exit_code = int(message.get("exit_code", 2))
        raise error
    current = registry.get(run.id) or run
    current.job_pid = message.get("job_pid", current.job_pid)
    return current


def _spawn_supervisor(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    return subprocess.Popen(argv, **kwargs)


def _await_handshake(fd: int, timeout_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None


def _last_line(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1][:300] if lines else None
    return None
