"""A damaged checkpoint never costs a good one, and a stuck writer never freezes training."""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.real.runs import script, wait_for
from trainguard import Checkpointer

pytestmark = pytest.mark.real


def _train(folder: Path, steps: range, *, keep: int = 2) -> Checkpointer:
    ckpt = Checkpointer(folder, every=None, every_steps=1, keep=keep)
    for step in steps:
        ckpt.maybe_save(step, {"step": step, "weights": bytes([step % 256]) * 4096})
        ckpt.wait()
    return ckpt


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)


def test_pruning_keeps_new_checkpoints_when_every_kept_one_is_damaged(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _train(folder, range(50)).close()
    kept = sorted(folder.glob("step-*"))
    assert [p.name for p in kept] == ["step-000000000048", "step-000000000049"]
    for checkpoint in kept:
        _flip_one_byte(checkpoint / "tree.pkl")  # same size: only the checksum can tell

    ckpt = Checkpointer(folder, every=None, every_steps=1, keep=2)
    assert ckpt.load_latest() is None and len(ckpt.damaged) == 2
    assert sorted(p.name.split("-")[1] for p in folder.glob("damaged-step-*")) == ["step", "step"]
    assert not list(folder.glob("step-*")), "damaged checkpoints are moved aside, not left to be chosen"
    ckpt.maybe_save(0, {"step": 0})
    ckpt.wait()
    assert (folder / "step-000000000000").exists(), "the newest valid checkpoint was deleted"
    for step in range(1, 4):
        ckpt.maybe_save(step, {"step": step})
        ckpt.wait()
    ckpt.close()
    assert sorted(p.name for p in folder.glob("step-*")) == ["step-000000000002", "step-000000000003"]
    assert not list(folder.glob("damaged-*")), "damaged ones go once `keep` valid ones were written after them"
    assert Checkpointer(folder, every=None, handle_signals=False).load_latest()["step"] == 3


def test_a_truncated_checkpoint_is_moved_aside_by_pruning_and_never_counted(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _train(folder, range(3)).close()
    newest = folder / "step-000000000002" / "tensors.bin"
    newest.write_bytes(b"")  # cut short, as a full disk or a power loss leaves it
    (folder / "step-000000000002" / "tree.pkl").write_bytes(b"")
    ckpt = _train(folder, range(3, 5))
    ckpt.close()
    assert sorted(p.name for p in folder.glob("step-*")) == ["step-000000000003", "step-000000000004"]


WRITER_TRAINER = """
    import sys, time
    from trainguard import Checkpointer
    ckpt = Checkpointer(sys.argv[1], every=None, every_steps=int(sys.argv[2]), keep=2)
    for step in range(400):
        time.sleep(0.05)
        ckpt.maybe_save(step, {"step": step, "blob": b"x" * 1_000_000})
        print(step, time.monotonic(), flush=True)
        if ckpt.stop_requested:
            print("stopped", step, flush=True)
            break
    ckpt.close()
"""


def _writer_of(pid: int) -> int:
    def find() -> int | None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes()
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid and b"trainguard.checkpoint._writer" in argv:
                return int(entry.name)
        return None

    return wait_for(find, what="the checkpoint writer process")


@pytest.mark.parametrize("moment", ["idle", "any"])
def test_a_stopped_writer_does_not_freeze_training_and_saves_go_on(tmp_path: Path, moment: str) -> None:
    """``idle``: the writer is stopped between two saves, waiting for the next one (a save of a
    megabyte of non-tensor state then must not block on the writer's socket); ``any``: at whatever
    moment the 10th step comes, often in the middle of a save."""
    folder = tmp_path / "ckpt"
    every_steps = 20 if moment == "idle" else 1
    trainer = subprocess.Popen([sys.executable, script(tmp_path, "t.py", WRITER_TRAINER), str(folder), str(every_steps)],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    writer = None
    try:
        lines = _read_lines(trainer, count=10, timeout_s=30)
        writer = _writer_of(trainer.pid)
        if moment == "idle":  # just after a save is on disk: the next one is a second away
            wait_for(lambda: list(folder.glob("step-*")) and not list(folder.glob(".tmp-*")), what="a first save")
        os.kill(writer, signal.SIGSTOP)  # a writer hung on a dead mount, or stopped by a person
        after_stop = _read_lines(trainer, timeout_s=8)  # a frozen trainer prints nothing: the gaps show it
        lines += after_stop
        trainer.send_signal(signal.SIGTERM)  # a stop must still save at once
        lines += _read_lines(trainer, timeout_s=30, until="stopped")
    finally:
        trainer.kill()
        if writer is not None:
            with_suppress_kill(writer)
    assert len(after_stop) >= 40, f"training froze behind the stopped writer: {len(after_stop)} steps in 8 s"
    times = [float(line.split()[1]) for line in lines if line.strip() and line.split()[0].isdigit()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 1.0, f"training stalled {max(gaps):.1f} s behind a stopped writer"
    stops = [line for line in lines if line.startswith("stopped")]
    assert stops, "the trainer did not stop on SIGTERM: it froze behind the stopped writer"
    saved = int(stops[0].split()[1])
    steps = sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*"))
    assert steps and steps[-1] == saved, f"the stop save is missing: {steps} vs {saved}"
    assert not list(folder.glob(".tmp-*")), "the killed writer's half-written folder was left behind"


def _read_lines(process: subprocess.Popen, *, timeout_s: float, count: int | None = None,
                until: str | None = None) -> list[str]:  # fmt: skip
    """Lines the process prints within ``timeout_s`` (never blocks past it, whatever it does)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    buffered = ""
    while time.monotonic() < deadline and (count is None or len(lines) < count):
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(process.stdout.fileno(), 65536).decode()
        if not chunk:
            break
        buffered += chunk
        *complete, buffered = buffered.split("\n")
        lines += complete
        if until is not None and any(line.startswith(until) for line in complete):
            break
    return lines


def with_suppress_kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
