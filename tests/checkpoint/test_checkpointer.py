"""Checkpointer: round trips, periods, retention, damage, signals, full disks, exact resume."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from tests.real import faults
from trainguard import Checkpointer, CheckpointError, capture_rng, restore_rng
from trainguard.checkpoint._atomic_write import write_checkpoint
from trainguard.checkpoint._format import MANIFEST_FILE
from trainguard.checkpoint._verified_read import complete_checkpoints


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def step_dirs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("step-"))


@pytest.mark.parametrize("asynchronous", [True, False])
def test_round_trip_keeps_every_tensor_kind_and_the_structure(tmp_path: Path, asynchronous: bool) -> None:
    shared = torch.arange(6, dtype=torch.float32)
    state = {
        "step": 7,
        "model": OrderedDict(
            [
                ("w", torch.randn(3, 4)),
                ("half", torch.randn(5).to(torch.bfloat16)),
                ("mask", torch.tensor([True, False])),
            ]
        ),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
        "strided": torch.arange(20).reshape(4, 5).t(),
        "tied": [shared, shared],
        "meta": {"lr": 1e-3, "name": "vit", "betas": (0.9, 0.999), "numbers": list(range(5))},
    }
    with Checkpointer(tmp_path, asynchronous=asynchronous) as ckpt:
        ckpt.save(state, 7)
        ckpt.wait()
        loaded = ckpt.load_latest()
    assert loaded["step"] == 7 and loaded["meta"] == state["meta"]
    assert isinstance(loaded["model"], OrderedDict) and list(loaded["model"]) == ["w", "half", "mask"]
    for key in ("w", "half", "mask"):
        assert loaded["model"][key].dtype == state["model"][key].dtype
        assert torch.equal(loaded["model"][key], state["model"][key])
    assert torch.equal(loaded["scalar"], state["scalar"]) and loaded["scalar"].shape == ()
    assert loaded["empty"].shape == (0, 3)
    assert torch.equal(loaded["strided"], state["strided"])
    assert torch.equal(loaded["tied"][0], shared) and torch.equal(loaded["tied"][1], shared)


def test_plain_python_state_needs_no_torch(tmp_path: Path) -> None:
    script = f"""
        import sys
        from trainguard import Checkpointer
        with Checkpointer({str(tmp_path)!r}) as ckpt:
            ckpt.save({{"step": 3, "weights": [0.5, 0.25], "epoch": 1}}, 3)
            ckpt.wait()
            assert ckpt.load_latest() == {{"step": 3, "weights": [0.5, 0.25], "epoch": 1}}
        assert "torch" not in sys.modules and "click" not in sys.modules
        print("ok")
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr


def test_every_steps_and_every_period_with_an_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    with Checkpointer(tmp_path / "steps", every=None, every_steps=3, clock=clock) as ckpt:
        saved = []
        for step in range(10):
            if ckpt.maybe_save(step, lambda: {"x": 1}):
                saved.append(step)
                ckpt.wait()  # each save on disk before the next step: the cadence alone decides
    assert saved == [2, 5, 8]
    with Checkpointer(tmp_path / "time", every="90s", clock=clock) as ckpt:
        saved = []
        for step in range(10):
            clock.now += 30
            if ckpt.maybe_save(step, {"x": step}):
                saved.append(step)
                ckpt.wait()
    assert saved == [2, 5, 8]


@pytest.mark.parametrize("every", [float("nan"), float("inf"), 0, -5, "0s"])
def test_a_period_that_could_never_fall_due_is_refused(tmp_path: Path, every) -> None:
    # nan compares false with every time: such a Checkpointer never saved, not even at close().
    with pytest.raises(ValueError, match="duration"):
        Checkpointer(tmp_path / "ckpt", every=every, handle_signals=False)


def test_a_due_save_waits_for_the_one_in_flight_without_blocking_training(tmp_path: Path) -> None:
    """Training never waits for the disk: a save that falls due while the previous one is still being
    written is postponed to a later step, and it happens as soon as the writer is free."""
    with Checkpointer(tmp_path, every=None, every_steps=1) as ckpt:
        assert ckpt.maybe_save(0, {"blob": b"x"})
        writer = ckpt._writer.process.pid
        os.kill(writer, signal.SIGSTOP)  # a slow disk: the save of step 0 is still being written
        try:
            started = time.monotonic()
            assert not ckpt.maybe_save(1, {"blob": b"y"})
            assert time.monotonic() - started < 0.05
        finally:
            os.kill(writer, signal.SIGCONT)
        ckpt.wait()
        assert ckpt.maybe_save(2, {"blob": b"z"})
        ckpt.wait()
    assert step_dirs(tmp_path)[-1] == "step-000000000002"


def test_only_the_newest_keep_checkpoints_stay(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, keep=2) as ckpt:
        for step in (10, 20, 30, 40):
            ckpt.save({"step": step, "w": torch.full((100,), float(step))}, step)
        ckpt.wait()
    assert step_dirs(tmp_path) == ["step-000000000030", "step-000000000040"]


def test_a_damaged_newest_checkpoint_is_skipped_and_reported(tmp_path: Path, caplog) -> None:
    with Checkpointer(tmp_path) as ckpt:
        for step in (1, 2):
            ckpt.save({"step": step, "w": torch.full((1000,), float(step))}, step)
        ckpt.wait()
    data = tmp_path / "step-000000000002" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="trainguard.checkpoint"), Checkpointer(tmp_path) as ckpt:
        state = ckpt.load_latest()
        assert state["step"] == 1
        assert len(ckpt.damaged) == 1 and "checksum" in ckpt.damaged[0]
    assert "skipping damaged checkpoint" in caplog.text


def test_a_folder_without_manifest_is_not_a_checkpoint_and_is_cleaned(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 5, pickle.dumps({"skeleton": {"step": 5}, "specs": []}), [])
    half = tmp_path / "step-000000000009"
    half.mkdir()
    (half / "tensors.bin").write_bytes(b"partial")
    litter = tmp_path / ".tmp-step-000000000010-999999"
    litter.mkdir()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-000000000005"]
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.load_latest() == {"step": 5}
    assert step_dirs(tmp_path) == ["step-000000000005"] and not litter.exists()


def test_manifest_is_written_last_with_sizes_and_checksums(tmp_path: Path) -> None:
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save({"w": torch.ones(10)}, 1)
        path = ckpt.wait()
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["format"] == 1 and manifest["step"] == 1 and manifest["time"] > 0
    assert set(manifest["files"]) == {"tensors.bin", "tree.pkl"}
    assert manifest["files"]["tensors.bin"]["size"] == 64 and "crc32" in manifest["files"]["tensors.bin"]
    assert (path / MANIFEST_FILE).stat().st_mtime_ns >= max(p.stat().st_mtime_ns for p in path.iterdir())


def test_full_disk_fails_clearly_and_keeps_the_last_checkpoint(tmp_path: Path, caplog) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"mounting a small tmpfs {reason}")
    with faults.small_tmpfs(tmp_path / "ckpt", "2m") as folder:
        with Checkpointer(folder, keep=5, every_steps=1) as ckpt:
            ckpt.save({"step": 1, "w": torch.ones(100_000)}, 1)  # 400 KB
            ckpt.wait()
            with pytest.raises(CheckpointError, match="MB free"):
                ckpt.save({"step": 2, "w": torch.ones(1_000_000)}, 2)  # 4 MB: cannot fit
            with caplog.at_level(logging.ERROR, logger="trainguard.checkpoint"):
                assert ckpt.maybe_save(3, {"step": 3, "w": torch.ones(1_000_000)}) is False
            assert "checkpoint not saved" in caplog.text
        # The writer itself hits ENOSPC (the folder fills behind the size check): a clear error, no litter.
        with pytest.raises(CheckpointError, match="disk full"):
            write_checkpoint(folder, 4, b"tree", [bytes(3 * 1024 * 1024)])
        assert step_dirs(folder) == ["step-000000000001"]
        assert not [p for p in folder.iterdir() if p.name.startswith(".tmp-")]
        with Checkpointer(folder) as ckpt:
            assert ckpt.load_latest()["step"] == 1


def test_sigterm_mid_training_saves_the_state_before_the_process_exits(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import time, torch
        from trainguard import Checkpointer
        ckpt = Checkpointer({str(tmp_path / "ckpt")!r}, every="1h")
        w = torch.zeros(1000)
        for step in range(1_000_000):
            w += 1
            print("step", step, flush=True)
            ckpt.maybe_save(step, lambda: {{"step": step, "w": w}})
            if ckpt.stop_requested:
                print("stopped at", step, flush=True)
                break
            time.sleep(0.01)
        """)
    )
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    for line in job.stdout:
        if line.startswith("step 20"):
            job.send_signal(signal.SIGTERM)
            break
    rest = job.stdout.read()
    assert job.wait(timeout=60) == 0
    stopped_at = int(rest.strip().splitlines()[-1].split()[-1])
    with Checkpointer(tmp_path / "ckpt", handle_signals=False) as ckpt:
        state = ckpt.load_latest()
    assert state["step"] == stopped_at and torch.equal(state["w"], torch.full((1000,), stopped_at + 1.0))


def test_an_existing_signal_handler_still_runs(tmp_path: Path) -> None:
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        with Checkpointer(tmp_path, every=None) as ckpt:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert seen == [signal.SIGUSR1]
            assert ckpt.maybe_save(4, {"step": 4}) is True and ckpt.stop_requested
        assert signal.getsignal(signal.SIGUSR1) is not None and seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _train(model, optimizer, steps: range) -> None:
    for _ in steps:
        x = torch.randn(16, 8)
        target = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _fresh():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_resumed_training_is_bit_identical_to_uninterrupted_training(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, optimizer = _fresh()
    _train(model, optimizer, range(40))
    uninterrupted = [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(0)
    model, optimizer = _fresh()
    with Checkpointer(tmp_path, every=None, every_steps=25) as ckpt:
        for step in range(30):  # dies at step 30, after the checkpoint at step 24
            _train(model, optimizer, range(1))
            ckpt.maybe_save(step, lambda: {"step": step, "model": model.state_dict(),
                                           "optim": optimizer.state_dict(), "rng": capture_rng()})  # fmt: skip
    torch.manual_seed(12345)  # the new process starts with other random state
    model, optimizer = _fresh()
    with Checkpointer(tmp_path) as ckpt:
        state = ckpt.load_latest()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    restore_rng(state["rng"])
    _train(model, optimizer, range(state["step"] + 1, 40))
    for resumed, expected in zip(model.parameters(), uninterrupted):
        assert torch.equal(resumed.detach(), expected)


def test_no_folder_anywhere_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("TRAINGUARD_CHECKPOINT_DIR", raising=False)
    with pytest.raises(CheckpointError, match="TRAINGUARD_CHECKPOINT_DIR"):
        Checkpointer()


def test_under_trainguard_run_the_folder_comes_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAINGUARD_CHECKPOINT_DIR", str(tmp_path / "from-env"))
    with Checkpointer(handle_signals=False) as ckpt:
        assert ckpt.directory == tmp_path / "from-env"


def test_a_forked_child_holding_the_writer_socket_does_not_delay_exit(tmp_path: Path) -> None:
    # DataLoader workers are forked from the trainer and keep copies of its file descriptors.
    script = f"""
        import os, time, torch
        from trainguard import Checkpointer
        ckpt = Checkpointer({str(tmp_path)!r}, handle_signals=False)
        ckpt.save({{"w": torch.ones(10)}}, 1)
        ckpt.wait()
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    """
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=True, timeout=60)
    assert time.monotonic() - started < 10


def test_a_file_where_the_folder_should_be_is_one_clear_error(tmp_path: Path) -> None:
    """Before: "[Errno 17] File exists" (issue 18.6)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    with pytest.raises(CheckpointError) as error:
        Checkpointer(a_file, handle_signals=False)
    assert str(error.value) == f"cannot keep checkpoints in {a_file}: {a_file} is a file, not a folder"
    with pytest.raises(CheckpointError, match=f"{a_file} is a file, not a folder"):
        Checkpointer(a_file / "ckpt", handle_signals=False)  # a parent in the way: named too
