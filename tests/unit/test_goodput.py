"""Goodput on runs recorded with known faults (tools/record_goodput.py wrote tests/data/goodput/: a
SIGKILL then a cgroup OOM kill, a frozen job the hang watchdog stopped, a job without trainguard's
library saving its own files), checked against what the logs say happened; and the rules on small
hand-made histories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard import goodput
from trainguard.goodput import AttemptRecord, CheckpointMark

DATA = Path(__file__).resolve().parents[1] / "data" / "goodput"
STEP_S = 0.1  # the recorded jobs' step time


def load(name: str) -> tuple[dict, goodput.Goodput]:
    data = json.loads((DATA / f"{name}.json").read_text())
    attempts = [AttemptRecord(a["n"], a["started_at"], a["ended_at"], a["cause"] is not None, a["cause"],
                              a["resumed_from"], a["progress"]) for a in data["attempts"]]  # fmt: skip
    marks = [CheckpointMark(c["time"], c["step"], c["path"]) for c in data["checkpoints"]]
    return data, goodput.compute(attempts, marks, now=0.0, run_active=False)


def assert_adds_up(result: goodput.Goodput) -> None:
    parts = result.kept_s + result.recomputed_s + result.restart_s + result.stalled_s + result.overhead_s
    assert parts == pytest.approx(result.wall_s, abs=1e-6)
    assert result.training_s == pytest.approx(result.kept_s + result.recomputed_s, abs=1e-6)
    assert result.ratio == pytest.approx(result.kept_s / result.wall_s)


def test_a_sigkill_and_a_cgroup_oom_cost_the_steps_past_the_checkpoint_and_the_restart() -> None:
    data, result = load("sigkill_then_cgroup_oom")
    attempts = data["attempts"]
    assert [loss.cause for loss in result.losses] == ["killed", "host_oom"]
    assert_adds_up(result)
    for loss, died, after in zip(result.losses, attempts, attempts[1:]):
        # The steps redone: those the dying attempt printed past the checkpoint the next one resumed from.
        redone = died["printed_steps"][1] - after["log_resumed_step"]
        assert redone == 3
        assert loss.recomputed_steps == redone
        assert loss.recomputed_s == pytest.approx(redone * STEP_S, abs=0.05)
        # Restart overhead: from the death to the next attempt's first reported step, backoff included.
        assert loss.restart_s == pytest.approx(after["progress"]["first_step_time"] - died["ended_at"], abs=1e-6)
        backoff = next(d["delay_s"] for d in data["decisions"] if d["time"] >= died["ended_at"])
        assert backoff <= loss.restart_s < backoff + 2
    killed, oom = result.losses
    assert killed.stalled_s < 0.1  # SIGKILLed while it printed steps: nothing stalled
    # The OOM-killed attempt spent its last moments filling memory after its last step.
    assert oom.stalled_s == pytest.approx(
        attempts[1]["ended_at"] - attempts[1]["progress"]["last_active_time"], abs=0.01
    )
    # 50 steps of 0.1 s were kept, less the first step of each attempt (counted as start-up).
    assert result.kept_s == pytest.approx(47 * STEP_S, abs=0.25)
    assert 0.3 < result.ratio < 0.6


def test_a_hang_costs_its_silence_as_stalled_time() -> None:
    data, result = load("hang_stopped_job")
    (loss,) = result.losses
    assert loss.cause == "hang"
    assert_adds_up(result)
    hung, after = data["attempts"]
    assert loss.recomputed_steps == hung["printed_steps"][1] - after["log_resumed_step"] == 3
    assert loss.recomputed_s == pytest.approx(3 * STEP_S, abs=0.05)
    # Silent from step 12 until the 2 s watchdog fired and the 1 s grace ran out (ticks are 1 s).
    assert 3.0 <= loss.stalled_s <= 4.5


def test_a_job_without_the_library_is_measured_from_its_checkpoint_files() -> None:
    data, result = load("own_files_sigkill")
    (loss,) = result.losses
    assert result.measured_by == "checkpoints" and loss.measured_by == "checkpoints"
    assert_adds_up(result)
    died, after = data["attempts"]
    resumed = next(c for c in data["checkpoints"] if c["path"] == after["resumed_from"])
    assert loss.recomputed_s == pytest.approx(died["ended_at"] - resumed["time"], abs=1e-6)
    assert loss.restart_s == pytest.approx(after["started_at"] - died["ended_at"], abs=1e-6)
    assert result.overhead_s == 0.0


# ---------------------------------------------------------------------------------------------- rules
def reported(first_step: int, first_time: float, step: int, step_time: float, **more: object) -> dict:
    return {"first_step": first_step, "first_step_time": first_time, "step": step, "step_time": step_time, **more}


def test_a_stop_asked_for_then_continued_days_later_is_a_pause_not_a_loss() -> None:
    attempts = [
        AttemptRecord(1, 0.0, 101.0, False, None, None, reported(0, 1.0, 100, 101.0, stop_signal=15)),
        AttemptRecord(
            2, 10_000.0, 10_102.0, False, None, "/c/step-100", reported(101, 10_002.0, 200, 10_101.0, resumed_step=100)
        ),
    ]
    result = goodput.compute(attempts, [CheckpointMark(101.0, 100, "/c/step-100")], now=0.0, run_active=False)
    assert result.paused_s == pytest.approx(10_000.0 - 101.0)
    assert result.wall_s == pytest.approx(101.0 + 102.0)
    assert all(loss.total_s == 0 for loss in result.losses) and result.recomputed_s == 0
    assert result.kept_s == pytest.approx(100.0 + 99.0)
    assert result.overhead_s == pytest.approx(1.0 + 2.0 + 1.0)


def test_a_restart_without_any_checkpoint_redoes_everything() -> None:
    attempts = [
        AttemptRecord(1, 0.0, 60.0, True, "segfault", None, reported(0, 1.0, 59, 60.0)),
        AttemptRecord(2, 65.0, 130.0, False, None, None, reported(0, 66.0, 63, 129.0)),
    ]
    result = goodput.compute(attempts, [], now=0.0, run_active=False)
    (loss,) = result.losses
    assert loss.recomputed_s == pytest.approx(59.0) and loss.recomputed_steps == 59
    assert loss.restart_s == pytest.approx(66.0 - 60.0)
    assert result.kept_s == pytest.approx(63.0)


def test_a_run_that_ended_in_a_death_loses_what_it_had_not_saved() -> None:
    attempts = [AttemptRecord(1, 0.0, 50.0, True, "python_error", None, reported(0, 1.0, 49, 50.0))]
    marks = [CheckpointMark(20.0, 19, "/c/step-19"), CheckpointMark(40.0, 39, "/c/step-39")]
    ended = goodput.compute(attempts, marks, now=99.0, run_active=False)
    assert ended.losses[0].recomputed_steps == 10 and ended.losses[0].recomputed_s == pytest.approx(10.0)
    # While the run may still restart by itself, that work is not counted lost yet.
    backing_off = goodput.compute(attempts, marks, now=99.0, run_active=True)
    assert backing_off.recomputed_s == 0 and backing_off.wall_s == pytest.approx(50.0)


def test_a_running_attempt_trains_until_now() -> None:
    attempts = [AttemptRecord(1, 0.0, None, False, None, None, reported(0, 2.0, 40, 41.0))]
    result = goodput.compute(attempts, [], now=45.0, run_active=True)
    assert result.wall_s == pytest.approx(45.0) and result.kept_s == pytest.approx(43.0)
    assert result.ratio == pytest.approx(43.0 / 45.0)


def test_checkpoints_saved_between_two_reports_place_the_steps_in_time() -> None:
    # The job reported only its first step (reports lag by seconds); its saves say when step 24 and 29 were done.
    attempts = [
        AttemptRecord(1, 0.0, 20.0, True, "host_oom", None, reported(0, 1.0, 0, 1.0, last_active_time=19.0)),
        AttemptRecord(2, 25.0, 40.0, False, None, "/c/step-24", reported(25, 26.0, 38, 39.0, resumed_step=24)),
    ]
    marks = [CheckpointMark(13.0, 24, "/c/step-24"), CheckpointMark(16.0, 29, "/c/step-29")]
    result = goodput.compute(attempts, marks, now=0.0, run_active=False)
    loss = result.losses[0]
    # Redone: from step 24 (t=13) until it stopped training (t=19): 6 s; at its rate (29 steps in 15 s)
    # it reached step 34.8, so 11 steps.
    assert loss.recomputed_s == pytest.approx(6.0) and loss.recomputed_steps == 11
    assert loss.stalled_s == pytest.approx(1.0)


def test_a_checkpoint_of_unknown_step_and_time_says_so() -> None:
    attempts = [
        AttemptRecord(1, 0.0, 10.0, True, "killed", None, {}),
        AttemptRecord(2, 12.0, 20.0, False, None, "/elsewhere/model.pt", {}),
    ]
    result = goodput.compute(attempts, [], now=0.0, run_active=False)
    assert result.losses[0].measured_by == "unknown" and result.recomputed_s == 0
    assert result.losses[0].restart_s == pytest.approx(2.0)


def test_no_attempts_no_ratio() -> None:
    result = goodput.compute([], [], now=5.0, run_active=True)
    assert result.ratio is None and result.to_dict()["goodput"] is None
