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

pytestmark = [pytest.mark.real, pytest.mark.slow]  # real torchrun with two ranks: the slower tier
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
only_rank0 = os.environ.get("ONLY_RANK0") == "1"  # the common `if rank == 0: save` pattern
ckpt = Checkpointer(sys.argv[1], every="1s", keep=100) if rank == 0 or not only_rank0 else None
weights = torch.zeros(4)
sigterm_at = int(os.environ.get("SIGTERM_AT", "-1"))
for step in range(int(sys.argv[2])):
    time.sleep(0.02 + 0.01 * rank)
    grad = torch.ones(4)
    dist.all_reduce(grad)
    weights += grad
    if rank == 1 and step == sigterm_at:
        os.kill(os.getpid(), 15)  # a stop signal that reaches one rank only
    if ckpt is None:
        continue
    ckpt.maybe_save(step, lambda: {"step": step, "weights": weights.clone()})
    if ckpt.stop_requested:
        break
if ckpt is not None:
    ckpt.close()
# One write of the whole line: two ranks share the pipe, and an unbuffered print writes its text and
# its newline apart, so the ranks' lines could run into one.
os.write(1, (f"rank {rank} left at step {step} stop_requested={ckpt is not None and ckpt.stop_requested} "
             f"weights={weights.tolist()}\n").encode())
dist.barrier()  # a clean end: a rank that leaves while another still closes can die in gloo's teardown
dist.destroy_process_group()
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


def ranks_left(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if " left at step " in line)


def shards(folder: Path) -> dict[str, list[str]]:
    return {p.name: sorted(q.name for q in p.iterdir()) for p in sorted(folder.glob("step-*"))}


def test_saves_due_by_time_are_taken_at_the_same_step_on_every_rank(tmp_path: Path) -> None:
    done, folder = torchrun(tmp_path, 200)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = shards(folder)
    # Before, rank 0 saved steps 22, 55, 87, ... and rank 1 steps 31, 64, 96, ...: none complete.
    assert len(saved) >= 2, saved
    assert all(files == ["job.json", "rank-00000", "rank-00001"] for files in saved.values()), saved


def test_a_signal_that_reaches_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    done, folder = torchrun(tmp_path, 400, SIGTERM_AT="40")
    # Before, rank 1 saved and left at once and rank 0 waited in its next all_reduce for good.
    assert done.returncode == 0, done.stderr[-2000:]
    left = ranks_left(done.stdout)
    assert len(left) == 2 and all("stop_requested=True" in line for line in left), left
    steps = {line.split(" left at step ")[1].split()[0] for line in left}
    assert len(steps) == 1, left
    (step,) = steps
    assert 40 <= int(step) < 400
    assert shards(folder)[f"step-{int(step):012d}"] == ["job.json", "rank-00000", "rank-00001"]


def test_a_job_where_only_rank_0_makes_a_checkpointer_trains_on_and_is_told_why_no_step_completes(
    tmp_path: Path,
) -> None:
    """The agreement is never a collective: one that only rank 0 entered would pair with the training's
    own all_reduce (a wrong sum, a hang). Here training goes on untouched, and the log says why."""
    done, folder = torchrun(tmp_path, 200, ONLY_RANK0="1")
    assert done.returncode == 0, done.stderr[-2000:]
    left = [line for line in ranks_left(done.stdout) if " left at step 199 " in line]
    assert len(left) == 2 and all(line.endswith("weights=[400.0, 400.0, 400.0, 400.0]") for line in left), left
    assert "only 1 of the job's 2 ranks made a Checkpointer" in done.stderr
    assert not list(folder.glob("step-*/job.json"))  # rank 0's shards alone: never complete
