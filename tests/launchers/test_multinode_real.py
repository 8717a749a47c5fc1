"""Two simulated nodes on this machine, each under its own `trainguard run` (two state folders, one
shared checkpoint folder), around the same real torchrun command: `--nnodes 2 --nproc-per-node 1
--rdzv-backend c10d`, gloo. A fault on node 1's worker (SIGKILL from outside, or the OOM killer of
node 1's memory cgroup): node 1 names the root cause, node 0 names peer_failure and restarts at once,
both rendezvous again, resume from the same step (the newest one complete for both ranks), finish,
and the two ranks end with equal weights. A node whose peer never comes back ends after
--peer-timeout with peer_failure (exit 75), not a silent wait."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.launchers.jobs import TRAIN
from tests.real import faults
from tests.real.runs import free_port, script, wait_for
from trainguard.supervisor.launchers import worker_identity

pytestmark = [pytest.mark.real, pytest.mark.slow]
torch = pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")


class Node:
    def __init__(self, tmp_path: Path, index: int, command: list[str], *run_args: str, **env: str) -> None:
        self.home = tmp_path / f"node{index}"
        environment = {**os.environ, "TRAINGUARD_HOME": str(self.home), "OUT_DIR": str(tmp_path / "out"), **env}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainguard", "run", "--foreground", "--name", f"node{index}", *run_args, "--",
             *command],
            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def log(self, n: int) -> str:
        found = list(self.home.glob(f"runs/*/attempt-{n}.log"))
        return found[0].read_text(errors="replace") if found else ""

    def worker(self) -> int:
        for child in psutil.Process(self.process.pid).children(recursive=True):
            identity = worker_identity(child.pid)
            if (
                identity is not None
                and "train.py" in " ".join(child.cmdline())
                and "_writer" not in " ".join(child.cmdline())
            ):
                return child.pid
        raise AssertionError("no worker found")

    def finish(self, timeout: float = 300) -> tuple[int, dict]:
        try:
            self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        info = subprocess.run(
            [sys.executable, "-m", "trainguard", "status", f"node{self.home.name[-1]}", "--json"],
            env={**os.environ, "TRAINGUARD_HOME": str(self.home)}, capture_output=True, text=True, check=False,
        )  # fmt: skip
        return self.process.returncode, json.loads(info.stdout)


def launcher_command(job: str, port: int) -> list[str]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    return [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job", job]  # fmt: skip


def training_again(log: str) -> float:
    return float(re.search(r"attempt 2 trains again at ([0-9.]+)", log).group(1))


@pytest.mark.parametrize("fault", ["sigkill", "cgroup_oom"])
def test_a_fault_on_node_1_restarts_both_nodes_from_one_step(tmp_path: Path, fault: str) -> None:
    if fault == "cgroup_oom" and (reason := faults.why_no_memory_cgroup()):
        pytest.skip(reason)
    job = script(tmp_path, "train.py", TRAIN)
    (tmp_path / "out").mkdir()
    shared = tmp_path / "shared-checkpoints"
    command = launcher_command(job, free_port())
    common = ("--checkpoint-dir", str(shared), "--peer-timeout", "120s")
    env = {"TOTAL_STEPS": "40", "STEP_SLEEP": "0.05"}
    node0 = Node(tmp_path, 0, command, *common, **env)
    if fault == "sigkill":
        node1 = Node(tmp_path, 1, command, *common, **env)
        wait_for(lambda: "step 14 " in node1.log(1), timeout=120, what="node 1 training to step 14")
        fault_at = time.time()
        os.kill(node1.worker(), signal.SIGKILL)
    else:
        node1 = Node(tmp_path, 1, command, *common, "--memory-limit", "1200M", FAULT="oom", FAULT_RANK="-1",
                     FAULT_STEP="14", **env)  # fmt: skip
        wait_for(
            lambda: "loads the whole dataset" in node1.log(1),
            timeout=120,
            what="node 1's worker to start eating memory",
        )
        fault_at = time.time()
    code0, info0 = node0.finish()
    code1, info1 = node1.finish()
    assert (code0, code1) == (0, 0), (node0.process.stderr.read(), node1.process.stderr.read())

    # node 1 names the root cause; node 0 names its lost peer and restarted at once
    first1, first0 = info1["attempts"][0], info0["attempts"][0]
    expected = "killed" if fault == "sigkill" else "host_oom"
    assert first1["cause"] == expected, first1["diagnosis"]
    assert first0["cause"] == "peer_failure", first0["diagnosis"]
    assert "first_failure" not in first0["diagnosis"]  # the first failure is on the other node
    second0 = info0["attempts"][1]
    gap = _seconds(second0["started_at"]) - _seconds(first0["ended_at"])
    assert gap <= 1.0, f"node 0 waited {gap} s before restarting"

    # both resumed from the same step, the newest complete for both ranks, and finished equal
    resumed = {info0["attempts"][1]["resumed_from"], info1["attempts"][1]["resumed_from"]}
    assert len(resumed) == 1 and None not in resumed, resumed
    step = int(Path(resumed.pop()).name.split("-")[1])
    for node in (node0, node1):
        assert re.search(rf"rank [01] attempt 2 starts at step {step + 1} ", node.log(2)), node.log(2)[:2000]
    assert info0["state"] == info1["state"] == "succeeded"
    zero, one = (torch.load(tmp_path / "out" / f"final-rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(zero[k], one[k]) for k in zero)
    again = max(training_again(node0.log(2)), training_again(node1.log(2)))
    print(f"\n{fault}: fault to training again on both nodes: {again - fault_at:.1f} s "
          f"(node 0 restarted {gap:.2f} s after its attempt ended; resumed at step {step + 1})")  # fmt: skip


def test_a_node_whose_peer_never_comes_back_ends_with_peer_failure_after_the_peer_timeout(tmp_path: Path) -> None:
    job = script(tmp_path, "train.py", TRAIN)
    (tmp_path / "out").mkdir()
    started = time.monotonic()
    alone = Node(tmp_path, 0, launcher_command(job, free_port()), "--peer-timeout", "15s", "--grace", "5s")
    code, info = alone.finish(timeout=120)
    took = time.monotonic() - started
    assert code == 75  # EX_TEMPFAIL: a scheduler may start the whole job again
    assert info["state"] == "failed" and "did not join" in info["reason"]
    assert [a["cause"] for a in info["attempts"]] == ["peer_failure"]
    assert 15 <= took < 60
    assert "the other nodes did not join in 15 s" in alone.log(1)


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()
