"""Crash safety for real: a training process saving checkpoints in a loop is SIGKILLed at random
moments, 50 times. After every kill the newest checkpoint that loads is complete and matches its
step, and no half-written folder or temporary file piles up."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from trainguard import Checkpointer

# 50 in the suite; benchmarks/crash_safety.sh runs hundreds through the same test.
# A few kills in the quick tier, fifty in the slower one (TRAINGUARD_CRASH_KILLS overrides both).
QUICK_KILLS, SLOW_KILLS = 8, 50
KEEP = 3

TRAINER = """
import sys, torch
torch.set_num_threads(1)
from trainguard import Checkpointer
ckpt = Checkpointer(sys.argv[1], every=None, every_steps=1, keep={keep}, asynchronous=sys.argv[2] == "async")
state = ckpt.load_latest()
start = state["step"] + 1 if state else 0
for step in range(start, start + 1_000_000):
    ckpt.maybe_save(step, lambda: {{"step": step, "w": torch.full((300_000,), float(step)),
                                   "b": torch.arange(1000) + step, "tag": "step %d" % step}})
    if step == start:  # killed only once a save of this attempt is complete, however loaded the machine
        ckpt.wait()
        print("ready", flush=True)
"""


def _wait_for_group_to_end(pgid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError("the checkpoint writer outlived its job by 30 s")


@pytest.mark.parametrize("kills", [QUICK_KILLS, pytest.param(SLOW_KILLS, marks=pytest.mark.slow)])
def test_random_sigkills_never_leave_a_broken_or_partial_checkpoint(tmp_path: Path, kills: int) -> None:
    kills = int(os.environ.get("TRAINGUARD_CRASH_KILLS", kills))
    rng = random.Random(2026)
    folder = tmp_path / "ckpt"
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(TRAINER.format(keep=KEEP)))
    last_step = -1
    for kill in range(kills):
        mode = "async" if kill % 3 else "sync"
        job = subprocess.Popen(
            [sys.executable, str(script), str(folder), mode], stdout=subprocess.PIPE, start_new_session=True
        )
        assert job.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.4))
        if rng.random() < 0.7:
            os.killpg(job.pid, signal.SIGKILL)  # the whole job dies: trainer and writer
        else:
            job.send_signal(signal.SIGKILL)  # only the trainer: the writer finishes its save, then exits
        job.wait()
        _wait_for_group_to_end(job.pid)

        with Checkpointer(folder, handle_signals=False) as ckpt:  # a restart: cleans what the kill left
            state = ckpt.load_latest()
            assert ckpt.damaged == [], ckpt.damaged
        assert state is not None, f"kill {kill}: no loadable checkpoint"
        step = state["step"]
        assert step >= last_step, f"kill {kill}: went back from {last_step} to {step}"
        assert state["tag"] == f"step {step}"
        assert torch.equal(state["w"], torch.full((300_000,), float(step)))
        assert torch.equal(state["b"], torch.arange(1000) + step)
        last_step = step

        leftovers = sorted(p.name for p in folder.iterdir())
        assert not [name for name in leftovers if name.startswith(".tmp-")], leftovers
        complete = [name for name in leftovers if name.startswith("step-")]
        assert all((folder / name / "manifest.json").exists() for name in complete), leftovers
        # A kill between a new manifest and the pruning of the oldest leaves one extra, never more.
        assert len(complete) <= KEEP + 1, leftovers
    assert last_step > kills  # the runs made progress between the kills
    print(f"{kills} random SIGKILLs: every restart found a complete checkpoint matching its step")
