"""Starting and ending supervision: what is checked before a run detaches, the supervisor's start-up
handshake with the command that started it, adopting a run whose supervisor died, continuing an
ended run in place, and stopping a run that has no supervisor.

Every path that acts on a run's job holds the run's supervisor lock first, so two of them never act
on one job at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from trainguard import causes
from trainguard._i18n import Text
from trainguard._proc import ProcessRef
from trainguard.causes import CAUSE_IDS, Retry
from trainguard.errors import TrainguardError, UsageError
from trainguard.paths import open_private, state_dir
from trainguard.store.registry import Registry, Run
from trainguard.store.states import TERMINAL_STATES, RunState
from trainguard.supervisor import lock as run_lock
from trainguard.supervisor.containment import KILL_TIMEOUT_S, Containment, stop_gracefully
from trainguard.supervisor.job import JobOptions
from trainguard.supervisor.policy import RestartPolicy, verdict_exit_code
from trainguard.supervisor.runner import Supervisor

MIN_MEMORY_LIMIT = 64 * 1024**2
HANDSHAKE_TIMEOUT_S = 120.0  # NVML start-up on a machine with many GPUs takes seconds


# ---------------------------------------------------------------------------------------------- preflight
def check_command(command: list[str], cwd: str) -> None:
    """A command that cannot start is refused before any run record exists."""
    program = command[0]
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd, program)
        if not os.path.exists(path):
            raise UsageError(f"no such command: {program}", f"命令不存在：{program}")
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise UsageError(f"not an executable file: {program}", f"不是可执行文件：{program}")
    elif shutil.which(program) is None:
        raise UsageError(f"command not found: {program}", f"找不到命令：{program}")


def check_cwd(cwd: str) -> None:
    try:
        os.listdir(cwd)
    except OSError as exc:
        raise UsageError(f"cannot use the working folder {cwd}: {exc.strerror}",
                         f"无法使用工作目录 {cwd}：{exc.strerror}") from None  # fmt: skip


def check_checkpoint_dir(path: str) -> None:
    """The job's checkpoint folder can be created and written, or the run is refused now."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".trainguard-probe-"):
            pass
    except OSError as exc:
        raise UsageError(
            f"--checkpoint-dir {path}: cannot write there ({exc.strerror or exc})",
            f"--checkpoint-dir {path}：无法写入（{exc.strerror or exc}）",
        ) from None


def check_memory_limit(limit: int) -> None:
    """Between 64 MiB and what the machine has (RAM + swap), and enforceable by a memory cgroup."""
    from trainguard.probes import cgroups

    ceiling = psutil.virtual_memory().total + psutil.swap_memory().total
    if not MIN_MEMORY_LIMIT <= limit <= ceiling:
        raise UsageError(
            f"--memory-limit must be between 64M and {ceiling / 1024**3:.1f}G (this machine's RAM + swap), "
            f"not {limit} bytes",
            f"--memory-limit 必须在 64M 与 {ceiling / 1024**3:.1f}G（本机内存 + swap）之间，而不是 {limit} 字节",
        )
    cgroups.create(f"trainguard-check-{os.getpid()}", limit).remove()


def parse_retry_overrides(items: tuple[str, ...]) -> dict[str, str]:
    overrides = {}
    for item in items:
        cause, _, value = item.partition("=")
        if cause not in CAUSE_IDS or value not in {r.value for r in Retry}:
            raise UsageError(
                f"--retry {item!r}: use CAUSE=yes|no|once with a cause id such as cuda_oom",
                f"--retry {item!r}：格式为 CAUSE=yes|no|once，CAUSE 为原因 id，例如 cuda_oom",
            )
        overrides[cause] = value
    return overrides


def options_record(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def create_run(
    command: list[str], *, name: str | None, options: dict[str, Any]
) -> tuple[Registry, Run, run_lock.SupervisorLock]:
    """A new run, and its supervisor lock: taken before any other command can see the run, so that
    none takes a run still starting for one whose supervisor died (`run --name`, `adopt`, `stop`).
    The caller hands the lock to the supervisor (``supervise_run``, ``start_detached``)."""
    registry = Registry(state_dir())
    held: list[run_lock.SupervisorLock] = []

    def hold(run_id: str, run_dir: Path) -> None:
        held.append(run_lock.SupervisorLock.acquire(run_dir, run_id, patience_s=0))
        options.setdefault("checkpoint_dir", str(run_dir / "checkpoints"))  # in the record from its first moment

    try:
        run = registry.create_run(command, name=name, cwd=os.getcwd(), options=options, before_visible=hold)
    except BaseException:
        for lock in held:
            lock.release()
        raise
    return registry, run, held[0]


# ---------------------------------------------------------------------------------------------- supervising
def job_options(run: Run) -> JobOptions:
    o = run.options
    return JobOptions(
        command=tuple(run.command),
        cwd=run.cwd,
        checkpoint_dir=o["checkpoint_dir"],
        checkpoint_glob=o.get("checkpoint_glob"),
        checkpoint_layout=o.get("checkpoint_layout", "auto"),
        resume_arg=o.get("resume_arg"),
        hang_timeout_s=o.get("hang_timeout_s"),
        peer_timeout_s=o.get("peer_timeout_s", 600.0),
        grace_s=o.get("grace_s", 120.0),
        stop_signal=o.get("stop_signal", 15),
        memory_limit=o.get("memory_limit"),
        sample_interval_s=o.get("sample_interval_s", 5.0),
        metrics_port=o.get("metrics_port"),
        metrics_bind=o.get("metrics_bind", "127.0.0.1"),
    )


def _policy(run: Run) -> RestartPolicy:
    o = run.options
    return RestartPolicy(
        mode=o.get("restart", "on-failure"),
        max_restarts=o.get("max_restarts", 10),
        retry_overrides={cause: Retry(value) for cause, value in o.get("retry", {}).items()},
        requeue=bool(o.get("requeue", False)),
    )


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


def supervise_run(
    run_id: str,
    *,
    registry: Registry | None = None,
    adopt: bool = False,
    restart: bool = False,
    handshake_fd: int | None = None,
    on_started: Callable[[Run], None] | None = None,
    lock: run_lock.SupervisorLock | None = None,
    handed_lock: tuple[int, float] | None = None,
) -> int:
    """Supervise a run until it ends; the exit status is the run's verdict (DESIGN section 5).
    ``lock``: the run's supervisor lock, already held here; ``handed_lock``: its descriptor and the
    time it was taken, handed to this process by the command that created the run."""
    handshake = Handshake(handshake_fd)
    prepared = lock is not None or handed_lock is not None
    try:
        registry = registry or Registry(state_dir())
        run = registry.get(run_id)
        if run is None:
            raise UsageError(f"no run {run_id}", f"没有运行 {run_id}")
        if lock is None and handed_lock is not None:
            lock = run_lock.SupervisorLock.inherit(handed_lock[0], run.run_dir, handed_lock[1])
        lock = lock or run_lock.SupervisorLock.acquire(run.run_dir, run.id)
        run = registry.get(run_id)  # read again under the lock: another supervisor may have changed it
        state = RunState(run.state)
        if adopt and state in TERMINAL_STATES:
            raise UsageError(f"run {run.id} has ended ({run.state})", f"运行 {run.id} 已结束（{run.state}）")
        if restart and not prepared:  # else the command that handed over the lock marked it starting
            if state not in TERMINAL_STATES:
                raise UsageError(f"run {run.id} is still {run.state}", f"运行 {run.id} 仍在{run.state}")
            registry.set_state(run.id, RunState.STARTING.value, reason=Text("continued in place", "原地继续"),
                               data={"restart": True})  # fmt: skip
            run.state = RunState.STARTING.value
        supervisor = Supervisor(registry, run, job_options(run), _policy(run), lock=lock)
        supervisor.install_signal_handlers()

        def started(current: Run) -> None:
            handshake.started(current)
            if on_started is not None:
                on_started(current)

        final = supervisor.supervise(adopt=adopt, on_started=started)
        supervisor.write_what_is_left()
    except TrainguardError as exc:
        if not handshake.pending and handshake_fd is not None:
            raise
        handshake.failed(exc)
        if handshake_fd is None:
            raise
        return exc.exit_code
    except OSError as exc:
        error = UsageError(f"cannot start the job: {exc.strerror or exc}", f"无法启动作业：{exc.strerror or exc}")
        handshake.failed(error)
        if handshake_fd is None:
            raise error from exc
        return error.exit_code
    finally:
        if lock is not None:
            lock.release()
    last = supervisor.run.attempts[-1].cause if supervisor.run.attempts else None
    return verdict_exit_code(
        final.value, last, causes.catalogue(), stopped_from_outside=supervisor.stopped_from_outside
    )


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


# ---------------------------------------------------------------------------------------------- watched or not
def prepare_continue(registry: Registry, run_id: str, **changes: Any) -> run_lock.SupervisorLock:
    """Take an ended run's lock and mark it starting again (with ``changes`` to its command, cwd,
    options), for the supervisor that continues it in place: a `stop` from now on is its business."""
    run = registry.get(run_id)
    if run is None:
        raise UsageError(f"no run {run_id}", f"没有运行 {run_id}")
    lock = run_lock.SupervisorLock.acquire(run.run_dir, run.id)
    try:
        run = registry.get(run_id)
        if RunState(run.state) not in TERMINAL_STATES:
            raise UsageError(f"run {run.id} is still {run.state}", f"运行 {run.id} 仍在{run.state}")
        if changes:
            registry.update_run(run.id, **changes)
        registry.set_state(run.id, RunState.STARTING.value, reason=Text("continued in place", "原地继续"),
                           data={"restart": True})  # fmt: skip
    except BaseException:
        lock.release()
        raise
    return lock


def undo_continue_if_never_started(registry: Registry, before: Run) -> None:
    """After a continuation that failed to start: the run ends as it was (marked starting by
    ``prepare_continue``), unless an attempt was recorded or a supervisor holds it now; a job started
    but not recorded goes first (see ``forget_if_never_started``)."""
    run = registry.get(before.id)
    if run is None or len(run.attempts) > len(before.attempts) or watched_by(run) is not None:
        return
    if RunState(run.state) in TERMINAL_STATES:  # a stop ended it before its attempt
        return
    _kill_unrecorded_jobs(run.id)
    registry.set_state(run.id, before.state, reason=Text("it could not be continued", "无法继续运行"))


def forget_if_never_started(registry: Registry, run_id: str) -> None:
    """After a start that failed: the run's record and folder go, unless an attempt was recorded or a
    supervisor holds it now (one that answered too late is still watching its job). A job its
    supervisor started but did not live to record (killed between the two) goes first: nobody was
    told of it, and nothing could stop it once its record is gone."""
    run = registry.get(run_id)
    if run is None or run.attempts or watched_by(run) is not None:
        return
    _kill_unrecorded_jobs(run_id)
    registry.delete_run(run_id)


def _processes_of_run(run_id: str) -> list[psutil.Process]:
    """Every process started for the run, recorded or not: each job and its children carry
    TRAINGUARD_RUN_ID."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # this command, if the job ran it, is spared
            if process.pid != os.getpid() and process.environ().get("TRAINGUARD_RUN_ID") == run_id:
                found.append(process)
    return found


def _kill_unrecorded_jobs(run_id: str) -> None:
    """Kill what was started for a run whose start failed before an attempt was recorded (a run's
    earlier attempts have all ended by then)."""
    _stop_unrecorded(run_id, signal.SIGKILL, grace_s=0)


def _stop_unrecorded(run_id: str, stop_signal: int, grace_s: float) -> int:
    """Stop what is left of a run once its recorded job is gone: a job its supervisor started while
    the registry could not be written and did not live to record. The stop signal, the grace period,
    then SIGKILL; how many processes there were."""
    found = _processes_of_run(run_id)
    for process in found:
        with contextlib.suppress(psutil.Error):
            process.send_signal(stop_signal)
    left = _wait_gone(found, grace_s)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    _wait_gone(left, KILL_TIMEOUT_S)
    return len(found)


def _wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each has ended (a zombie has: its parent may never reap it); those still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in processes if ProcessRef(p.pid, None).alive() and p.is_running()]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def watched_by(run: Run) -> ProcessRef | None:
    """The supervisor holding the run's lock, or None."""
    return run_lock.holder(run.run_dir)


def unwatched(run: Run) -> bool:
    """An active run whose supervisor is gone (killed, OOM-killed itself, the machine tool crashed)."""
    return RunState(run.state) not in TERMINAL_STATES and watched_by(run) is None


def stop_unwatched(registry: Registry, run: Run, grace_s: float) -> Text:
    """Stop a run that has no supervisor, as its supervisor would: the stop signal to the job's group,
    the grace period, then SIGKILL to everything left. Returns what really happened."""
    held = run_lock.SupervisorLock.acquire(run.run_dir, run.id)
    try:
        run = registry.get(run.id) or run
        if RunState(run.state) in TERMINAL_STATES:
            return Text(f"it had already ended ({run.state})", f"它已经结束（{run.state}）")
        last = run.attempts[-1] if run.attempts and run.attempts[-1].ended_at is None else None
        job = ProcessRef(last.pid, last.pid_start) if last and last.pid else None
        containment = Containment.from_record(last.containment if last else None, job)
        if job is None or (not job.alive() and not containment.pids()):
            what = Text("nothing was running: the job had already ended unwatched", "没有在运行的进程：作业已在无人监督时结束")
        else:
            stop_signal = int(run.options.get("stop_signal", 15))
            started = time.monotonic()
            in_time = stop_gracefully(containment, stop_signal, grace_s, job_exited=lambda: not job.alive())
            took = time.monotonic() - started
            what = (
                Text(f"the job ended {took:.1f} s after the stop signal", f"作业在停止信号后 {took:.1f} 秒结束")
                if in_time
                else Text(f"the job did not end within the {grace_s:g} s grace period and was killed",
                          f"作业在 {grace_s:g} 秒宽限期内没有结束，已被强制杀死")
            )
        containment.remove()
        unrecorded = _stop_unrecorded(run.id, int(run.options.get("stop_signal", 15)), grace_s)
        if unrecorded:
            what = Text(f"{what.en}; {unrecorded} process(es) of the run that its record did not know were stopped",
                        f"{what.zh}；另有 {unrecorded} 个记录中没有的该运行进程已被停止")  # fmt: skip
        if last is not None:
            last.ended_at = time.time()
            registry.end_attempt(run.id, last)
        reason = Text(f"stopped on request without a supervisor: {what.en}", f"在没有监督进程时按请求停止：{what.zh}")
        registry.set_state(run.id, RunState.STOPPED.value, reason=reason)
        return what
    finally:
        held.release()
