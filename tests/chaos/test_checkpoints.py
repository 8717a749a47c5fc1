"""A damaged checkpoint never costs a good one, and a stuck writer never freezes training."""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.real import faults
from tests.real.runs import script, wait_for
from trainguard import Checkpointer
from trainguard.checkpoint._writer_control import STUCK_MIN_S

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


@pytest.mark.parametrize("moment", ["idle", pytest.param("any", marks=pytest.mark.slow)])
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


def _saved_steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*"))


def _load_each(folder: Path, **kwargs) -> dict[int, object]:
    """Every checkpoint in the folder as it loads, by step (newest first, through the public API)."""
    loaded = {}
    for step in reversed(_saved_steps(folder)):
        state = Checkpointer(folder, every=None, handle_signals=False, **kwargs).load_latest()
        loaded[step] = state
        shutil.rmtree(folder / f"step-{step:012d}")
    return loaded


def test_a_state_that_outgrows_the_staging_buffer_is_still_saved(tmp_path: Path) -> None:
    """The writer kept a view into its old map of the staging buffer, so remapping it once the state
    grew (an optimizer's state appears after the first step) failed, and every save after it."""
    import torch

    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, every=None, keep=4, handle_signals=False)
    saved = {}
    for step, floats in enumerate([1_000, 1_000_000, 4_000_001, 1_000]):
        saved[step] = {"step": step, "w": torch.arange(floats, dtype=torch.float32), "rest": bytes([step]) * floats}
        ckpt.save(saved[step], step)
        ckpt.wait()
    ckpt.close()
    loaded = _load_each(folder)
    assert sorted(loaded) == [0, 1, 2, 3]
    for step, state in loaded.items():
        assert torch.equal(state["w"], saved[step]["w"]) and state["rest"] == saved[step]["rest"]


KILLED_WRITER_TRAINER = """
    import sys
    from trainguard import Checkpointer
    ckpt = Checkpointer(sys.argv[1], every=None, every_steps=1, keep=3)
    state = lambda step: {"step": step, "blob": bytes([step]) * 60_000_000}
    ckpt.maybe_save(0, state(0))
    ckpt.wait()
    ckpt.maybe_save(1, state(1))
    print("submitted", flush=True)
    sys.stdin.readline()  # meanwhile the writer is killed in the middle of step 1, and SIGTERM comes
    print("stop save", ckpt.maybe_save(2, state(2)), ckpt.stop_requested, flush=True)
    ckpt.close()
"""


def test_a_writer_killed_mid_save_loses_nothing_and_sigterm_still_saves(tmp_path: Path) -> None:
    """A writer killed mid-save (the OOM killer picks it, a person kills it): its save is still
    whole in the staging buffer and is written by the trainer, and SIGTERM's save is not refused
    because the save before it failed."""
    folder = tmp_path / "ckpt"
    trainer = subprocess.Popen([sys.executable, script(tmp_path, "t.py", KILLED_WRITER_TRAINER), str(folder)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert _read_lines(trainer, count=1, timeout_s=30) == ["submitted"]
        writer = _writer_of(trainer.pid)
        deadline = time.monotonic() + 10
        while not list(folder.glob(".tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.0005)
        assert list(folder.glob(".tmp-*")), "the writer was not caught writing step 1"
        os.kill(writer, signal.SIGKILL)
        trainer.send_signal(signal.SIGTERM)
        trainer.stdin.write("\n")
        trainer.stdin.flush()
        lines = _read_lines(trainer, timeout_s=30, until="stop save")
        assert trainer.wait(timeout=30) == 0
    finally:
        trainer.kill()
    assert "stop save True True" in lines, f"SIGTERM's save was not made: {lines}"
    assert not list(folder.glob(".tmp-*")), "the killed writer's half-written folder outlived close()"
    loaded = _load_each(folder)
    assert sorted(loaded) == [0, 1, 2], "a save was lost with the writer"
    for step, state in loaded.items():
        assert state == {"step": step, "blob": bytes([step]) * 60_000_000}


def test_a_writer_that_just_died_never_costs_the_next_save(tmp_path: Path) -> None:
    """Saves right after the writer was SIGKILLed: it may still look alive (BrokenPipeError escaped
    save() and maybe_save, ending the training) or die with the save unread (the save was lost)."""
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, every=None, keep=100, handle_signals=False)
    for round_ in range(24):
        ckpt.save({"step": 2 * round_}, 2 * round_)
        ckpt.wait()
        os.kill(_writer_of(os.getpid()), signal.SIGKILL)
        time.sleep([0, 0.0002, 0.0005, 0.001][round_ % 4])
        ckpt.save({"step": 2 * round_ + 1}, 2 * round_ + 1)
        ckpt.wait()
    ckpt.close()
    assert _saved_steps(folder) == list(range(48))
    assert not list(folder.glob(".tmp-*"))


PERIODIC_TRAINER = """
    import sys, time
    from trainguard import Checkpointer
    ckpt = Checkpointer(sys.argv[1], every=None, every_steps=60, keep=2)
    for step in range(400):
        time.sleep(0.05)
        ckpt.maybe_save(step, {"step": step})
        print(step, time.monotonic(), flush=True)
        if ckpt.stop_requested:
            print("stopped", step, flush=True)
            break
    ckpt.close()
"""


@pytest.mark.slow  # seconds of waiting on a stopped or throttled writer: the slower tier
def test_sigterm_waits_for_a_stopped_writer_no_longer_than_stuck_min_s(tmp_path: Path) -> None:
    """How long a save may be in flight was sized by the time from one save to the wait of the next
    (the whole save period), not by the save: with a save every 3 s, SIGTERM's save waited 9 s for a
    stopped writer, and with every="30m" it would wait past any scheduler's grace period."""
    from trainguard.checkpoint.checkpointer import STUCK_MIN_S

    folder = tmp_path / "ckpt"
    trainer = subprocess.Popen([sys.executable, script(tmp_path, "t.py", PERIODIC_TRAINER), str(folder)],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    writer = None
    try:
        lines = _read_lines(trainer, count=100, timeout_s=30)  # the first save, at step 59, is done
        writer = _writer_of(trainer.pid)
        os.kill(writer, signal.SIGSTOP)  # the second save, at step 119, gets no answer
        lines += _read_lines(trainer, count=25, timeout_s=30)
        trainer.send_signal(signal.SIGTERM)
        lines += _read_lines(trainer, timeout_s=30, until="stopped")
    finally:
        trainer.kill()
        if writer is not None:
            with_suppress_kill(writer)
    stops = [line for line in lines if line.startswith("stopped")]
    assert stops, "the trainer did not stop on SIGTERM"
    times = [float(line.split()[1]) for line in lines if line.strip() and line.split()[0].isdigit()]
    stall = max(b - a for a, b in itertools.pairwise(times))
    assert stall < STUCK_MIN_S + 1.5, f"SIGTERM's save waited {stall:.1f} s for a stopped writer"
    assert _saved_steps(folder) == [119, int(stops[0].split()[1])]


@pytest.mark.slow  # seconds of waiting on a stopped or throttled writer: the slower tier
def test_close_does_not_wait_a_minute_for_a_stopped_writer(tmp_path: Path) -> None:
    """close() (at exit, after SIGTERM's save) waited 60 s for a SIGSTOPped writer with nothing to
    write: past Kubernetes' 30 s grace period, and the job ended by SIGKILL."""
    from trainguard.checkpoint.checkpointer import STUCK_MIN_S

    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, every=None, handle_signals=False)
    ckpt.save({"step": 0}, 0)
    ckpt.wait()
    writer = _writer_of(os.getpid())
    os.kill(writer, signal.SIGSTOP)
    try:
        started = time.monotonic()
        ckpt.close()
        took = time.monotonic() - started
    finally:
        with_suppress_kill(writer)
    assert took < STUCK_MIN_S + 2, f"close() waited {took:.1f} s for a stopped writer"
    assert _saved_steps(folder) == [0] and not list(folder.glob(".tmp-*"))


@pytest.mark.slow  # seconds of waiting on a stopped or throttled writer: the slower tier
def test_a_rank_that_replaces_its_stuck_writer_keeps_its_shards_of_incomplete_steps(tmp_path: Path) -> None:
    """The clean-up after killing a stuck writer was the one for a rank that starts again: it removed
    this rank's own whole shards of steps the other ranks had not finished yet, so those steps never
    completed, and a crash then resumed every rank from an older step."""
    folder = tmp_path / "ckpt"
    rank0 = Checkpointer(folder, every=None, keep=3, rank=0, world_size=2, handle_signals=False)
    rank1 = Checkpointer(folder, every=None, keep=3, rank=1, world_size=2, handle_signals=False)
    rank0.save({"step": 0, "rank": 0}, 0)
    rank0.wait()
    writer = _writer_of(os.getpid())  # rank 0's: rank 1 has none yet
    rank1.save({"step": 0, "rank": 1}, 0)
    rank1.wait()
    rank0.save({"step": 10, "rank": 0}, 10)  # rank 0 is ahead of rank 1
    rank0.wait()
    os.kill(writer, signal.SIGSTOP)
    try:
        rank0.save({"step": 20, "rank": 0}, 20)
        rank0.wait()  # the stopped writer is replaced, and step 20 written here
        rank1.save({"step": 10, "rank": 1}, 10)
        rank1.wait()
    finally:
        with_suppress_kill(writer)
        rank0.close()
        rank1.close()
    for rank in (0, 1):
        assert Checkpointer(folder, every=None, rank=rank, world_size=2, handle_signals=False).load_latest() == {
            "step": 10,
            "rank": rank,
        }


ULIMIT_TRAINER = """
    import re, resource, sys
    import torch
    from trainguard import Checkpointer
    ckpt = Checkpointer(sys.argv[1], every=None, every_steps=1, keep=3)
    ckpt.maybe_save(0, {"step": 0, "w": torch.arange(1000.0)})
    ckpt.wait()
    used = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (used + 150_000_000, resource.RLIM_INFINITY))  # ulimit -v
    big = torch.ones(25_000_000)  # 100 MB: it fits, a staging copy of it does not
    print("big", ckpt.maybe_save(1, {"step": 1, "w": big}), flush=True)
    del big
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("small", ckpt.maybe_save(2, {"step": 2, "w": torch.arange(10.0)}), flush=True)
    ckpt.close()
"""


def test_a_staging_buffer_refused_by_ulimit_v_leaves_the_old_one_usable(tmp_path: Path) -> None:
    """Growing the staging buffer closed the old map before making the new one: when the new one
    was refused (ENOMEM under ulimit -v), the big save fell back to a synchronous one, but the next
    save that fitted the old size used the closed map, and its exception ended the training."""
    folder = tmp_path / "ckpt"
    done = subprocess.run([sys.executable, script(tmp_path, "t.py", ULIMIT_TRAINER), str(folder)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["big True", "small True"]
    assert "saving synchronously" in done.stderr
    loaded = _load_each(folder)
    assert sorted(loaded) == [0, 1, 2]
    assert loaded[1]["w"].numel() == 25_000_000 and bool((loaded[1]["w"] == 1).all())
    assert loaded[2]["w"].tolist() == list(range(10))


FAILED_SAVE_TRAINER = """
    import os, resource, signal, sys
    from trainguard import Checkpointer
    ckpt = Checkpointer(sys.argv[1], every=None, every_steps=1, keep=3)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, hard))  # the writer, started now, keeps it
    ckpt.maybe_save(0, {"step": 0})
    ckpt.wait()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    ckpt.maybe_save(1, {"step": 1, "blob": b"x" * 2_000_000})  # the writer cannot write it: EFBIG
    os.kill(os.getpid(), signal.SIGTERM)
    print("stop save", ckpt.maybe_save(2, {"step": 2, "blob": b"y" * 2_000_000}), flush=True)
    ckpt.close()
"""


def test_a_failed_save_in_flight_does_not_cost_sigterms_save(tmp_path: Path) -> None:
    """SIGTERM's save first waited for the save in flight, and when that one had failed (a full
    disk, a quota, a file size limit), its error ended SIGTERM's save before it began."""
    folder = tmp_path / "ckpt"
    done = subprocess.run([sys.executable, script(tmp_path, "t.py", FAILED_SAVE_TRAINER), str(folder)],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "File too large" in done.stderr, "the writer was meant to fail step 1"
    assert done.stdout.strip() == "stop save True"
    assert Checkpointer(folder, every=None, handle_signals=False).load_latest() == {"step": 2, "blob": b"y" * 2_000_000}


def test_a_rank_whose_save_came_late_saves_the_same_steps_as_the_others_again(tmp_path: Path) -> None:
    """A rank whose due save waited for one still in flight (a slow or stopped writer) saved a few
    steps late, and counted every later save from there: its steps never matched the other ranks'
    again, and no checkpoint of the job completed for the rest of the run."""
    folder = tmp_path / "ckpt"
    rank0 = Checkpointer(folder, every=None, every_steps=5, keep=3, rank=0, world_size=2, handle_signals=False)
    rank1 = Checkpointer(folder, every=None, every_steps=5, keep=3, rank=1, world_size=2, handle_signals=False)
    rank0.save({"step": 0, "rank": 0}, 0)
    rank0.wait()
    writer = _writer_of(os.getpid())  # rank 0's: rank 1 has none yet
    rank1.save({"step": 0, "rank": 1}, 0)
    rank1.wait()
    os.kill(writer, signal.SIGSTOP)  # rank 0's next save stays in flight
    try:
        for step in range(1, 31):
            if step == 11:
                os.kill(writer, signal.SIGCONT)
                wait_for(lambda: not rank0.saving, what="rank 0's late save")
            rank0.maybe_save(step, {"step": step, "rank": 0})
            rank1.maybe_save(step, {"step": step, "rank": 1})
            rank1.wait()  # rank 1's writer keeps up, and rank 0's does once it runs again
            if step >= 11:
                rank0.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(writer, signal.SIGCONT)
        rank0.close()
        rank1.close()
    latest = Checkpointer(folder, every=None, rank=1, world_size=2, handle_signals=False).load_latest()
    assert latest is not None and latest["step"] >= 25, f"the ranks never saved the same step again: {latest}"


@pytest.mark.parametrize("asynchronous", [True, False])
def test_sparse_quantized_and_nested_tensors_are_saved_exactly(tmp_path: Path, asynchronous: bool) -> None:
    """Every tensor was copied as raw dense bytes: a sparse embedding's or a quantized model's
    state made save() raise a RuntimeError, out of maybe_save too, and the training ended."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR is a beta feature
        state = {
            "coo": torch.eye(5).to_sparse(),
            "csr": torch.eye(4).to_sparse_csr(),
            "q": torch.quantize_per_tensor(torch.linspace(-1, 1, 9), 0.05, 3, torch.qint8),
            "nested": torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)]),
            "dense": torch.arange(7.0),
        }
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, every=None, every_steps=1, asynchronous=asynchronous, handle_signals=False)
    assert ckpt.maybe_save(0, state), ckpt.last_error
    ckpt.close()
    loaded = Checkpointer(folder, every=None, handle_signals=False).load_latest()
    assert loaded["coo"].layout == torch.sparse_coo and torch.equal(loaded["coo"].to_dense(), torch.eye(5))
    assert loaded["csr"].layout == torch.sparse_csr and torch.equal(loaded["csr"].to_dense(), torch.eye(4))
    assert loaded["q"].is_quantized and torch.equal(loaded["q"].int_repr(), state["q"].int_repr())
    assert (loaded["q"].q_scale(), loaded["q"].q_zero_point()) == (0.05, 3)
    assert [t.tolist() for t in loaded["nested"].unbind()] == [[1.0, 1.0], [0.0, 1.0, 2.0]]
    assert torch.equal(loaded["dense"], state["dense"])


def _writers_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"trainguard.checkpoint._writer" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


@pytest.mark.slow  # seconds of waiting on a stopped or throttled writer: the slower tier
def test_a_slow_writer_that_keeps_working_is_never_killed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A writer was declared stuck after STUCK_MIN_S in flight, however busy it was: on a loaded
    machine (a CPU limit, cpulimit, every core taken by the job) a save longer than that was killed,
    started again, killed again... and no checkpoint was ever written. Here the writer runs 1% of
    the time, as cpulimit throttles a process (SIGSTOP/SIGCONT). The save must
    outlast STUCK_MIN_S to tell (40 MB at 5 ms in 0.5 s took 4.4 s on one CI run): 60 MB, 5 ms in 0.75 s."""
    import threading

    import torch

    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, every=None, every_steps=1, handle_signals=False)
    weights = torch.ones(15_000_000)  # 60 MB: unthrottled, a fraction of a second to write
    done = threading.Event()

    def throttle() -> None:
        writers: list[int] = []
        scanned = 0.0
        while not done.is_set():
            now = time.monotonic()
            if now - scanned > 0.05:
                writers, scanned = _writers_of(os.getpid()), now
            running = now % 0.75 < 0.005
            for pid in writers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT if running else signal.SIGSTOP)
            time.sleep(0.004)
        for pid in _writers_of(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    throttler = threading.Thread(target=throttle, daemon=True)
    throttler.start()
    started = time.monotonic()
    try:
        step = 0
        while ckpt.last_saved is None and time.monotonic() - started < 60:
            ckpt.maybe_save(step, {"step": step, "w": weights})
            step += 1
            time.sleep(0.05)
    finally:
        done.set()
        throttler.join()
        ckpt.close()
    took = time.monotonic() - started
    killed = [r.getMessage() for r in caplog.records if "writer did not" in r.getMessage()]
    assert not killed, f"a writer that kept working was killed: {killed}"
    assert took > STUCK_MIN_S, f"the throttled save took {took:.1f} s: too short to tell"
    assert 0 in _saved_steps(folder), "the slow save never reached the disk"
    first = _load_each(folder)[0]
    assert first["step"] == 0 and torch.equal(first["w"], weights)


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_a_disk_sized_for_keep_checkpoints_goes_on_saving(tmp_path: Path, asynchronous: bool) -> None:
    """A disk with room for `keep` checkpoints and not one more: each save replaces the oldest (it goes
    anyway) instead of being refused forever, and the newest one is never touched."""
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    weights = 3 * 1024 * 1024
    with faults.small_tmpfs(tmp_path / "disk", "8m") as disk:
        ckpt = Checkpointer(disk / "ckpt", every=None, every_steps=1, keep=2, asynchronous=asynchronous)
        for step in range(6):
            assert ckpt.maybe_save(step, {"step": step, "weights": bytes([step]) * weights}), ckpt.last_error
            ckpt.wait()
        ckpt.close()
        assert ckpt.last_error is None
        assert sorted(p.name for p in (disk / "ckpt").iterdir() if not p.name.startswith(".")) == [
            "step-000000000004",
            "step-000000000005",
        ]
        state = Checkpointer(disk / "ckpt", keep=2).load_latest()
        assert state["step"] == 5 and state["weights"] == bytes([5]) * weights

        # keep=1: its only checkpoint is never removed before its successor is whole, so a disk too
        # small for two refuses the save in one clear error, and the last checkpoint still loads.
        shutil.rmtree(disk / "ckpt")
        single = Checkpointer(disk / "one", every=None, every_steps=1, keep=1, asynchronous=asynchronous)
        assert single.maybe_save(0, {"step": 0, "weights": bytes(weights)})
        single.wait()
        filler = disk / "filler"
        filler.write_bytes(bytes(shutil.disk_usage(disk).free - 2 * 1024 * 1024))
        assert not single.maybe_save(1, {"step": 1, "weights": bytes(weights)})
        assert "not saving step 1" in str(single.last_error)
        single.close()
        assert Checkpointer(disk / "one", keep=1).load_latest()["step"] == 0


def test_a_damaged_checkpoint_on_a_disk_sized_for_keep_does_not_stop_every_later_save(tmp_path: Path) -> None:
    """A damaged checkpoint is kept aside for a person to look at, until `keep` newer ones exist; on a
    disk with room for `keep` and no more it was in the way of every later save, for good."""
    if reason := faults.why_no_root():
        pytest.skip(f"a small tmpfs: {reason}")
    weights = 3 * 1024 * 1024
    with faults.small_tmpfs(tmp_path / "disk", "8m") as disk:
        ckpt = Checkpointer(disk / "ckpt", every=None, every_steps=1, keep=2)
        for step in range(2):
            assert ckpt.maybe_save(step, {"step": step, "weights": bytes([step]) * weights})
            ckpt.wait()
        biggest = max((disk / "ckpt" / "step-000000000001").iterdir(), key=lambda p: p.stat().st_size)
        os.truncate(biggest, biggest.stat().st_size - 1)
        for step in range(2, 6):
            assert ckpt.maybe_save(step, {"step": step, "weights": bytes([step]) * weights}), ckpt.last_error
            ckpt.wait()
        ckpt.close()
        state = Checkpointer(disk / "ckpt", keep=2).load_latest()
        assert state["step"] == 5 and state["weights"] == bytes([5]) * weights
