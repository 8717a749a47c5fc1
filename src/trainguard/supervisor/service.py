"""Starting runs: validating the command, recording the run, and supervising it here (foreground) or
in a detached process of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainguard._proc import pid_alive
from trainguard.causes import CAUSE_IDS, Retry
from trainguard.errors import UsageError
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, Run
from trainguard.supervisor.job import JobOptions
from trainguard.supervisor.policy import RestartPolicy
from trainguard.supervisor.runner import Supervisor
from trainguard.supervisor.states import TERMINAL_STATES, RunState


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


def create_run(command: list[str], *, name: str | None, options: dict[str, Any]) -> tuple[Registry, Run]:
    registry = Registry(state_dir())
    run = registry.create_run(command, name=name, cwd=os.getcwd(), options=options)
    if not options.get("checkpoint_dir"):
        options["checkpoint_dir"] = str(Path(run.run_dir) / "checkpoints")
        registry.update_run(run.id, options=json.dumps(options))
        run.options = options
    return registry, run


def _job_options(run: Run) -> JobOptions:
    o = run.options
    return JobOptions(
        command=tuple(run.command),
        cwd=run.cwd,
        checkpoint_dir=o["checkpoint_dir"],
        checkpoint_glob=o.get("checkpoint_glob"),
        checkpoint_layout=o.get("checkpoint_layout", "auto"),
        resume_arg=o.get("resume_arg"),
        hang_timeout_s=o.get("hang_timeout_s"),
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
    )


def supervise_run(run_id: str, *, registry: Registry | None = None, adopt: bool = False) -> int:
    registry = registry or Registry(state_dir())
    run = registry.get(run_id)
    if run is None:
        print(f"trainguard supervisor: no run {run_id}", file=sys.stderr)
        return 2
    supervisor = Supervisor(registry, run, _job_options(run), _policy(run))
    supervisor.install_signal_handlers()
    final = supervisor.supervise(adopt=adopt)
    return 0 if final in (RunState.SUCCEEDED, RunState.STOPPED) else 1


def start_detached(registry: Registry, run: Run, *, wait_s: float = 10.0, adopt: bool = False) -> Run:
    """Start the run's supervisor in a session of its own, and return once the job has started."""
    with open(Path(run.run_dir) / "supervisor.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainguard.supervisor", run.id, *(["--adopt"] if adopt else [])],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=run.cwd,
        )
    registry.update_run(run.id, supervisor_pid=process.pid)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        current = registry.get(run.id)
        if adopt:
            started = any(event["kind"] == "adopted" for event in registry.events(run.id))
        else:
            started = bool(current.attempts)
        if started or RunState(current.state) in TERMINAL_STATES or process.poll() is not None:
            return current
        time.sleep(0.05)
    return registry.get(run.id)


def unwatched(run: Run) -> bool:
    """An active run whose supervisor is gone (killed, OOM-killed itself, machine tool crashed)."""
    return RunState(run.state) not in TERMINAL_STATES and not pid_alive(run.supervisor_pid)


def options_record(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}
