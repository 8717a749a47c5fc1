"""A save that fell due while the previous one was still being written, and the loop ended before a
later step could take it: ``wait()`` and ``close()`` take it, so the newest checkpoint holds the
newest state the loop offered (issue 19.6). Before, ``every_steps=1`` over 10 quick steps kept
step 0 only, and with 50 ms steps the last step's save was dropped, without a word."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from trainguard import Checkpointer


def newest_step(folder: Path) -> int | None:
    with Checkpointer(folder, every=None, handle_signals=False) as ckpt:
        state = ckpt.load_latest()
    return state["step"] if state else None


def test_ten_quick_steps_then_wait_keep_the_last_step(tmp_path: Path) -> None:
    weights = torch.zeros(2_000_000)  # 8 MB: written more slowly than a step takes
    with Checkpointer(tmp_path, every=None, every_steps=1, handle_signals=False) as ckpt:
        for step in range(10):
            weights += 1
            ckpt.maybe_save(step, lambda: {"step": step, "w": weights})
        ckpt.wait()
        assert newest_step(tmp_path) == 9
    assert torch.equal(Checkpointer(tmp_path, handle_signals=False).load_latest()["w"], torch.full((2_000_000,), 10.0))


def test_the_postponed_save_is_taken_by_wait_once_the_writer_is_free(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, every=None, every_steps=1, handle_signals=False) as ckpt:
        assert ckpt.maybe_save(0, {"step": 0})
        writer = ckpt._writer.process.pid
        os.kill(writer, signal.SIGSTOP)  # a slow disk: step 0 is still being written
        try:
            for step in range(1, 4):
                assert not ckpt.maybe_save(step, {"step": step})  # postponed: training never waits
        finally:
            os.kill(writer, signal.SIGCONT)
        ckpt.wait()
        assert newest_step(tmp_path) == 3  # the newest postponed one, not step 1


def test_close_at_exit_takes_the_postponed_save_of_the_last_step(tmp_path: Path) -> None:
    """The issue's loop, as a script that just ends: 50 ms steps, a save every step, no wait()."""
    job = f"""
        import time, torch
        from trainguard import Checkpointer
        ckpt = Checkpointer({str(tmp_path)!r}, every=None, every_steps=1)
        w = torch.zeros(25_000_000)  # 100 MB: a save takes longer than a step
        for step in range(6):
            w += 1
            ckpt.maybe_save(step, lambda: {{"step": step, "w": w}})
            time.sleep(0.05)
    """
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", textwrap.dedent(job)], check=True, timeout=120)
    assert newest_step(tmp_path) == 5, f"took {time.monotonic() - started:.1f} s"


def test_a_later_explicit_save_replaces_the_postponed_one(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, every=None, every_steps=1, handle_signals=False) as ckpt:
        ckpt.maybe_save(0, {"step": 0})
        os.kill(ckpt._writer.process.pid, signal.SIGSTOP)
        try:
            assert not ckpt.maybe_save(1, {"step": 1})
        finally:
            os.kill(ckpt._writer.process.pid, signal.SIGCONT)
        ckpt.save({"step": 7}, 7)
        ckpt.wait()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000000000000", "step-000000000007"]
