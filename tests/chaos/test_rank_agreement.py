"""Ranks of one job save the same steps, whatever their own clocks and signals say: real torchrun,
two CPU ranks (gloo), the bare Checkpointer as the README shows it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.runs import free_port, script

pytestmark = pytest.mark.real
pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")

# Rank 1 makes its Checkpointer 0.3 s after rank 0 (it loaded its data later): by its own clock
# every time-based save falls due several steps after rank 0's.
TRAIN = r"""
import os, sys, time
import torch, torch.distributed as dist
from trainguard import Checkpointer

dist.init_process_group("gloo")
rank = dist.get_rank()
time.sleep(0.3 * rank)
ckpt = Checkpointer(sys.argv[1], every="1s", keep=100)
weights = torch.zeros(4)
sigterm_at = int(os.environ.get("SIGTERM_AT", "-1"))
for step in range(int(sys.argv[2])):
    time.sleep(0.02 + 0.01 * rank)
    grad = torch.ones(4)
    dist.all_reduce(grad)
    weights += grad
    if rank == 1 and step == sigterm_at:
        os.kill(os.getpid(), 15)  # a stop signal that reaches one rank only
    ckpt.maybe_save(step, lambda: {"step": step, "weights": weights.clone()})
    if ckpt.stop_requested:
        break
ckpt.close()
print(f"rank {rank} left at step {step} stop_requested={ckpt.stop_requested}", flush=True)
"""


def torchrun(tmp_path: Path, steps: int, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    folder = tmp_path / "ckpt"
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    done = subprocess.run(
        [launcher, "--nproc-per-node", "2", "--master-port", str(free_port()), script(tmp_path, "train.py", TRAIN),
         str(folder), str(steps)],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done, folder


def shards(folder: Path) -> dict[str, list[str]]:
    return {p.name: sorted(q.name for q in p.iterdir()) for p in sorted(folder.glob("step-*"))}


def test_saves_due_by_time_are_taken_at_the_same_step_on_every_rank(tmp_path: Path) -> None:
    done, folder = torchrun(tmp_path, 130)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = shards(folder)
    # Before, rank 0 saved steps 22, 55, 87, ... and rank 1 steps 31, 64, 96, ...: none complete.
    assert len(saved) >= 2, saved
    assert all(files == ["job.json", "rank-00000", "rank-00001"] for files in saved.values()), saved


def test_a_signal_that_reaches_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    done, folder = torchrun(tmp_path, 400, SIGTERM_AT="40")
    # Before, rank 1 saved and left at once and rank 0 waited in its next all_reduce for good.
    assert done.returncode == 0, done.stderr[-2000:]
    left = sorted(line for line in done.stdout.splitlines() if " left at step " in line)
    assert len(left) == 2 and all(line.endswith("stop_requested=True") for line in left), left
    steps = {line.split(" left at step ")[1].split()[0] for line in left}
    assert len(steps) == 1, left
    (step,) = steps
    assert 40 <= int(step) < 400
    assert shards(folder)[f"step-{int(step):012d}"] == ["job.json", "rank-00000", "rank-00001"]
