"""``Checkpointer(every="auto")`` (issue 20): the Young–Daly period from the time this job's own saves
block training and the MTBF the supervisor hands over in TRAINGUARD_MTBF_S (else interval.py's
default), recomputed after each save and reported through the progress file."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pytest

from trainguard import Checkpointer
from trainguard import progress as progress_module
from trainguard.checkpoint._schedule import SaveSchedule
from trainguard.checkpoint.interval import DEFAULT_LOWER_S, DEFAULT_MTBF_S, DEFAULT_UPPER_S, checkpoint_interval


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def progress_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "progress.json"
    monkeypatch.setenv("TRAINGUARD_PROGRESS_FILE", str(path))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TRAINGUARD_MTBF_S", raising=False)
    monkeypatch.setattr(progress_module, "_record", {})
    return path


def test_the_period_follows_the_measured_save_cost_and_the_mtbf_from_the_environment(progress_file: Path) -> None:
    schedule = SaveSchedule("auto", None, sharded=False, clock=Clock(), environ={"TRAINGUARD_MTBF_S": "7200"})
    assert schedule.every_s == DEFAULT_LOWER_S and "no save measured yet" in schedule.why.en  # the shortest first
    schedule.measured(2.0)
    assert schedule.every_s == pytest.approx(math.sqrt(2 * 2.0 * 7200))  # 170 s
    assert "from TRAINGUARD_MTBF_S" in schedule.why.en and "2.0 s per save" in schedule.why.en
    schedule.measured(4.0)  # the mean of the recent saves
    assert schedule.every_s == pytest.approx(checkpoint_interval(3.0, 7200)[0])
    default = SaveSchedule("auto", None, sharded=False, clock=Clock(), environ={})
    default.measured(2.0)
    assert default.every_s == pytest.approx(math.sqrt(2 * 2.0 * DEFAULT_MTBF_S))
    assert "default of one failure in 1d00h" in default.why.en
    unreadable = SaveSchedule("auto", None, sharded=False, clock=Clock(), environ={"TRAINGUARD_MTBF_S": "soon"})
    assert unreadable._mtbf_s == DEFAULT_MTBF_S


def test_every_auto_saves_first_at_the_shortest_period_then_at_the_chosen_one(
    tmp_path: Path, progress_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINGUARD_MTBF_S", "1e15")  # one death in 30 million years: the longest period
    clock = Clock()
    saved = []
    with Checkpointer(tmp_path / "ckpt", every="auto", handle_signals=False, clock=clock) as ckpt:
        assert ckpt.every_s == DEFAULT_LOWER_S
        for step in range(600):
            clock.now += 30
            if ckpt.maybe_save(step, {"step": step}):
                saved.append(clock.now)
                ckpt.wait()
        assert ckpt.every_s == DEFAULT_UPPER_S and "capped at the longest" in ckpt.every_why
    assert saved[0] == DEFAULT_LOWER_S and saved[1] - saved[0] == DEFAULT_UPPER_S, saved[:3]
    record = json.loads(progress_file.read_text())
    assert record["checkpoint_interval_s"] == DEFAULT_UPPER_S
    assert "capped at the longest" in record["checkpoint_interval_why"] and record["checkpoint_interval_why_zh"]


def test_the_cost_is_what_the_save_blocks_not_the_asynchronous_write(
    tmp_path: Path, progress_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    costs: list[float] = []
    original = SaveSchedule.measured
    monkeypatch.setattr(SaveSchedule, "measured", lambda self, s: (costs.append(s), original(self, s)))
    with Checkpointer(tmp_path / "ckpt", every="auto", handle_signals=False) as ckpt:
        ckpt.save({"step": 0, "blob": b"x" * 1000}, 0)
        ckpt.wait()
        os.kill(ckpt._writer.process.pid, signal.SIGSTOP)  # the next write takes 2 s at least
        try:
            ckpt.save({"step": 1, "blob": b"y" * 1000}, 1)
            time.sleep(2)
        finally:
            os.kill(ckpt._writer.process.pid, signal.SIGCONT)
        ckpt.wait()
    assert len(costs) == 2 and costs[1] < 1.0, costs
