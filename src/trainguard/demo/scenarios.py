"""The demo's scenarios: the toy job under the real supervisor, one real fault at a time, in a state
folder of its own. Each reports what trainguard named, whether it restarted, where it resumed."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from trainguard._i18n import Text

TOY = [sys.executable, "-m", "trainguard.demo.toyjob"]
STEPS = 24
FAULT_STEP = 12


@dataclass
class Outcome:
    name: str
    real: bool
    skipped: str | None
    expected_cause: str | None
    cause: str | None = None
    confidence: float | None = None
    restarted: bool = False
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    seconds: float = 0.0
    passed: bool = False
    skipped_zh: str | None = None  # why it was skipped, for a person who reads Chinese

    def to_dict(self) -> dict:
        found = asdict(self)
        del found["skipped_zh"]  # the JSON contract (DESIGN section 5) has one "skipped" reason
        return found


class Sandbox:
    """A temporary state folder and the commands to run trainguard in it."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="trainguard-demo-"))
        self.env = {**os.environ, "TRAINGUARD_HOME": str(self.folder / "state")}

    def trainguard(
        self, *args: str, prefix: list[str] | None = None, timeout: float = 90
    ) -> subprocess.CompletedProcess:
        command = [*(prefix or []), sys.executable, "-m", "trainguard", *args]
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def last_run(self) -> dict:
        return json.loads(self.trainguard("ps", "--json").stdout)[0]

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.folder / "small")], capture_output=True, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def _why_not_root() -> Text | None:
    return None if os.geteuid() == 0 else Text("needs root", "需要 root 权限")


def _memory_cgroup_reason() -> Text | None:
    if os.geteuid() != 0:
        return Text("needs root (a memory cgroup)", "需要 root 权限（内存 cgroup）")
    from trainguard.errors import UsageError
    from trainguard.probes import cgroups

    try:
        cgroups.create(f"trainguard-demo-check-{os.getpid()}", 1 << 30).remove()
    except UsageError as exc:
        return Text(exc.message_en, exc.message_zh)
    return None


def _namespace_reason() -> Text | None:
    if os.geteuid() != 0:
        return Text("needs root (a private mount namespace)", "需要 root 权限（私有挂载命名空间）")
    if shutil.which("unshare") is None:
        return Text("unshare (util-linux) is not installed", "未安装 unshare（util-linux）")
    try:
        import torch  # noqa: F401
    except ImportError:
        return Text("needs torch for the DataLoader (pip install torch)", "DataLoader 需要 torch（pip install torch）")
    return None


def _judge(outcome: Outcome, run: dict, *, expect_restart: bool) -> Outcome:
    attempts = run["attempts"]
    first = attempts[0]
    outcome.cause, outcome.confidence = first["cause"], first["confidence"]
    outcome.restarted = len(attempts) > 1
    if outcome.restarted and attempts[1]["resumed_from"]:
        resumed = int(re.search(r"step-0*([0-9]+)", attempts[1]["resumed_from"]).group(1))
        outcome.resumed_from_step = resumed
        outcome.steps_lost = max(0, FAULT_STEP - resumed)
    finished = run["state"] == "succeeded" if expect_restart else run["state"] == "failed"
    outcome.passed = outcome.cause == outcome.expected_cause and outcome.restarted == expect_restart and finished
    return outcome


def _faulty_run(sandbox: Sandbox, outcome: Outcome, fault: str, *extra: str, prefix: list[str] | None = None,
                expect_restart: bool) -> Outcome:  # fmt: skip
    sandbox.trainguard("run", "--foreground", "--name", outcome.name, *extra, "--", *TOY, "--steps", str(STEPS),
                       "--fault", fault, "--fault-step", str(FAULT_STEP), prefix=prefix)  # fmt: skip
    return _judge(outcome, sandbox.last_run(), expect_restart=expect_restart)


# ---------------------------------------------------------------------------------------------- scenarios
def terminal_closed(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    """`trainguard run` from an SSH-like terminal (a pty), which then closes: the job must not notice."""
    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child: the shell of an SSH session
        os.execvpe(sys.executable, [sys.executable, "-m", "trainguard", "run", "--name", outcome.name, "--",
                                    *TOY, "--steps", str(STEPS)], sandbox.env)  # fmt: skip
    output = b""
    while b"status:" not in output:
        ready, _, _ = select.select([master], [], [], 30)
        if not ready:
            break
        output += os.read(master, 4096)
    os.waitpid(pid, 0)
    os.close(master)  # the connection drops
    deadline = time.monotonic() + 60
    run = sandbox.last_run()
    while run["state"] in ("running", "restarting") and time.monotonic() < deadline:
        time.sleep(0.2)
        run = sandbox.last_run()
    outcome.restarted = len(run["attempts"]) > 1
    outcome.cause = run["attempts"][0]["cause"]
    outcome.passed = run["state"] == "succeeded" and not outcome.restarted
    return outcome


def host_oom(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    return _faulty_run(sandbox, outcome, "host_oom", "--memory-limit", "192M", expect_restart=True)


def shm_too_small(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    script = 'mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"'
    prefix = ["unshare", "-m", "bash", "-c", script, "trainguard-demo"]
    return _faulty_run(sandbox, outcome, "shm", prefix=prefix, expect_restart=False)


def preempted(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    return _faulty_run(sandbox, outcome, "preempted", expect_restart=True)


def hang(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    return _faulty_run(sandbox, outcome, "hang", "--hang-timeout", "2s", "--grace", "2s", expect_restart=True)


def disk_full(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    small = sandbox.folder / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    return _faulty_run(sandbox, outcome, "disk_full", "--checkpoint-dir", str(small), expect_restart=False)


def python_error(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    return _faulty_run(sandbox, outcome, "python_error", expect_restart=False)


def cuda_oom(sandbox: Sandbox, outcome: Outcome) -> Outcome:
    """Without a GPU, a real recorded log (a 4-GPU torchrun job whose rank 1 ran out of memory) goes
    through the same diagnosis; said plainly: a replay."""
    from trainguard import causes
    from trainguard._resources import EXAMPLE_LOG_PATH
    from trainguard.postmortem import LogSource, investigate
    from trainguard.supervisor.policy import Outcome as PolicyOutcome
    from trainguard.supervisor.policy import RestartPolicy, decide

    with open(EXAMPLE_LOG_PATH, "rb") as log:
        diagnosis = investigate([LogSource(None, [log.read()])]).diagnosis
    decision = decide([PolicyOutcome(exit_code=1, signal=None, cause=diagnosis.cause, new_lines=100)],
                      RestartPolicy(), causes.catalogue())  # fmt: skip
    outcome.cause, outcome.confidence = diagnosis.cause, diagnosis.confidence
    outcome.restarted = decision.restart
    outcome.passed = diagnosis.cause == "cuda_oom" and decision.restart and decision.batch_scale == 0.5
    return outcome


@dataclass(frozen=True)
class Scenario:
    name: str
    title: Text
    expected_cause: str | None
    run: Callable[[Sandbox, Outcome], Outcome]
    why_not: Callable[[], Text | None] = lambda: None
    real: Callable[[], bool] = lambda: True


def _has_gpu() -> bool:
    return False  # the real CUDA OOM runs in tools/gpu_check.py on a GPU machine


SCENARIOS = [
    Scenario("terminal_closed", Text("the terminal closes under the job", "终端在作业运行时关闭"), None, terminal_closed),
    Scenario("host_oom", Text("host memory runs out (memory cgroup)", "主机内存耗尽（内存 cgroup）"), "host_oom", host_oom,
             _memory_cgroup_reason),
    Scenario("shm_exhausted", Text("/dev/shm too small for DataLoader workers", "/dev/shm 对 DataLoader worker 来说太小"),
             "shm_exhausted", shm_too_small, _namespace_reason),
    Scenario("preempted", Text("preemption: SIGTERM, then the grace period", "抢占：SIGTERM，然后是宽限期"), "preempted",
             preempted),
    Scenario("hang", Text("the job hangs", "作业卡住"), "hang", hang),
    Scenario("disk_full", Text("the checkpoint disk fills", "检查点磁盘写满"), "disk_full", disk_full, _why_not_root),
    Scenario("python_error", Text("a bug in the training code", "训练代码中的 bug"), "python_error", python_error),
    Scenario("cuda_oom", Text("CUDA out of memory (replayed log: no GPU here)", "CUDA 显存不足（回放日志：本机没有 GPU）"),
             "cuda_oom", cuda_oom, real=_has_gpu),
]  # fmt: skip


def run_scenario(scenario: Scenario) -> Outcome:
    outcome = Outcome(scenario.name, scenario.real(), None, scenario.expected_cause)
    reason = scenario.why_not()
    if reason:
        outcome.skipped, outcome.skipped_zh = reason
        return outcome
    sandbox = Sandbox()
    started = time.monotonic()
    try:
        scenario.run(sandbox, outcome)
    except (subprocess.SubprocessError, OSError, KeyError, IndexError, ValueError) as exc:
        outcome.passed = False
        outcome.skipped = None
        outcome.cause = outcome.cause or f"error: {type(exc).__name__}: {exc}"
    finally:
        outcome.seconds = round(time.monotonic() - started, 1)
        sandbox.close()
    return outcome
