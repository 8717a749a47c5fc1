"""Goodput on runs recorded with known faults (tools/record_goodput.py wrote tests/data/goodput/: a
SIGKILL then a cgroup OOM kill, a frozen job the hang watchdog stopped, a job without trainguard's
library saving its own files, stops with and without a checkpoint, a run recorded while it ran, a
job that reports nothing), checked against what the logs say happened; and the rules on small
hand-made histories."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainguard import goodput
from trainguard.goodput import AttemptRecord, CheckpointMark
from trainguard.units import format_duration

DATA = Path(__file__).resolve().parents[1] / "data" / "goodput"
STEP_S = 0.1  # the recorded jobs' step time


def load(name: str) -> tuple[dict, goodput.Goodput]:
    """A recorded run's goodput as ``status`` computes it: its attempts as the registry held them
    (through ``attempt_records``, with the run's state), at the time it was recorded."""
    data = json.loads((DATA / f"{name}.json").read_text())
    registry_attempts = [SimpleNamespace(n=a["n"], started_at=a["started_at"], ended_at=a["ended_at"],
                                         cause=a["cause"], exit_code=a.get("exit_code"), resumed_from=a["resumed_from"],
                                         progress=a["progress"]) for a in data["attempts"]]  # fmt: skip
    attempts = goodput.attempt_records(registry_attempts, run_state=data["state"])
    marks = [CheckpointMark(c["time"], c["step"], c["path"]) for c in data["checkpoints"]]
    active = data["state"] in ("starting", "running", "backoff", "stopping")
    return data, goodput.compute(attempts, marks, now=data.get("recorded_at", 0.0), run_active=active)


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
    # Trained until its last sign of life (its output, or the checkpoint it wrote just after), silent
    # from then to the kill.
    active_until = max(died["progress"]["last_active_time"], resumed["time"])
    assert loss.recomputed_s == pytest.approx(active_until - resumed["time"], abs=1e-6)
    assert loss.stalled_s == pytest.approx(died["ended_at"] - active_until, abs=1e-6)
    assert loss.restart_s == pytest.approx(after["started_at"] - died["ended_at"], abs=1e-6)
    assert result.overhead_s == 0.0


def test_a_stopped_run_without_any_checkpoint_kept_nothing() -> None:
    # Before: "48% (2.0 s of training kept in 4.2 s wall time)", nothing lost.
    data, result = load("stopped_without_checkpoint")
    (attempt,) = data["attempts"]
    assert data["state"] == "stopped" and attempt["signal"] == 15 and data["checkpoints"] == []
    assert_adds_up(result)
    assert result.kept_s == 0 and result.ratio == 0
    (loss,) = result.losses
    assert loss.cause is None and not loss.redone
    # All it trained is lost: the steps it printed (its last report, 2 s older, said step 20) ...
    assert loss.recomputed_steps == pytest.approx(attempt["printed_steps"][1], abs=1)
    # ... until the supervisor last saw it print one, killed by the stop.
    trained = attempt["progress"]["last_active_time"] - attempt["progress"]["first_step_time"]
    assert loss.recomputed_s == pytest.approx(trained, abs=1e-6)
    lost = f"{format_duration(loss.recomputed_s)} never saved"
    assert goodput.describe(result).startswith(f"0% (0.0 s of training kept in {format_duration(result.wall_s)} wall")
    assert f"; lost: {lost}, 0.0 s restarting" in goodput.describe(result)
    steps = f"({loss.recomputed_steps} steps)"
    assert goodput.describe_loss(loss).startswith(f"attempt 1 (stopped on request): {lost} {steps}")


def test_a_stop_that_killed_the_job_loses_the_steps_since_its_newest_checkpoint() -> None:
    # SIGTERM to `run --foreground` 143 steps after the newest checkpoint (199); the job dies unsaved.
    # Before: "81% (6.0 s of training kept in 7.4 s wall time)", 0 s lost.
    data, result = load("stop_unsaved")
    (attempt,) = data["attempts"]
    newest = max(c["step"] for c in data["checkpoints"])
    assert attempt["printed_steps"][1] - newest == 143
    (loss,) = result.losses
    assert loss.recomputed_steps == pytest.approx(143, abs=2) and not loss.redone
    assert loss.recomputed_s == pytest.approx(143 * 0.02, abs=0.1)
    assert result.kept_s == pytest.approx(newest * 0.02, abs=0.2)  # steps 0..199, the first one start-up
    assert_adds_up(result)


def test_the_attempt_that_continues_a_stopped_run_recomputes_what_the_stop_lost() -> None:
    # The same command again continues the run from step 199. Before: "1.9 s recomputed (95 steps)",
    # from the job's last report, 2 s before the SIGTERM.
    data, result = load("stop_unsaved_continued")
    stopped, after = data["attempts"]
    (loss,) = result.losses
    redone = stopped["printed_steps"][1] - after["log_resumed_step"]
    assert redone == 143 and loss.recomputed_steps == pytest.approx(redone, abs=2) and loss.redone
    assert loss.restart_s == 0 and result.paused_s > 0  # a stop, then a pause: no restart cost
    assert_adds_up(result)


def test_a_stop_that_saved_at_its_last_step_lost_nothing() -> None:
    data, result = load("stopped_after_saving")
    (attempt,) = data["attempts"]
    (checkpoint,) = data["checkpoints"]
    assert attempt["progress"]["stop_signal"] == 15 and checkpoint["step"] == attempt["printed_steps"][1]
    assert result.losses == () and result.kept_s == pytest.approx(result.training_s)
    assert result.kept_s == pytest.approx(attempt["printed_steps"][1] * STEP_S, abs=0.3)  # the first step is start-up
    assert_adds_up(result)


def test_a_running_run_keeps_its_newest_checkpoint_so_far_and_calls_the_rest_unsaved() -> None:
    # Recorded while it ran, 31 steps after its newest checkpoint. Before: "95% (8.1 s of training kept)".
    data, result = load("running_after_a_checkpoint")
    (attempt,) = data["attempts"]
    (checkpoint,) = data["checkpoints"]
    assert attempt["ended_at"] is None and result.active and result.losses == ()
    assert result.kept_s == pytest.approx(checkpoint["time"] - attempt["progress"]["first_step_time"], abs=1e-6)
    assert result.unsaved_s == pytest.approx(data["recorded_at"] - checkpoint["time"], abs=1e-6)
    assert result.unsaved_steps == pytest.approx(attempt["printed_steps"][1] - checkpoint["step"], abs=2)
    parts = result.kept_s + result.unsaved_s + result.overhead_s
    assert parts == pytest.approx(result.wall_s, abs=1e-6)
    assert result.ratio == pytest.approx(result.kept_s / result.wall_s)
    pct, kept, wall = f"{100 * result.ratio:.0f}%", format_duration(result.kept_s), format_duration(result.wall_s)
    unsaved = f"{format_duration(result.unsaved_s)} ({result.unsaved_steps} steps)"
    assert goodput.describe(result) == (
        f"{pct} so far ({kept} of training kept in {wall} wall time; {unsaved} of training not in a checkpoint yet)"
    )
    zh = goodput.describe(result, "zh")
    assert zh.startswith(f"目前 {pct}（") and "尚未存入检查点" in zh


def test_a_job_that_reports_no_steps_and_saves_nothing_has_an_unknown_goodput() -> None:
    # Before: "100% (3.1 s of training kept in 3.1 s wall time)".
    data, result = load("no_progress_job")
    assert data["attempts"][0]["printed_steps"] is None and data["checkpoints"] == []
    assert result.ratio is None and result.measured_by == "unknown" and result.to_dict()["goodput"] is None
    assert result.kept_s == 0 and result.unknown_s == pytest.approx(result.wall_s) and result.wall_s > 3.0
    wall = format_duration(result.wall_s)
    assert goodput.describe(result) == f"unknown: the job reports neither its steps nor checkpoints ({wall} wall time)"
    assert goodput.describe(result, "zh").startswith("未知")


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
    assert result.wall_s == pytest.approx(45.0) and result.training_s == pytest.approx(43.0)
    # Kept so far is what a checkpoint holds: none yet. The 43 s are unsaved, not lost.
    assert result.kept_s == 0 and result.unsaved_s == pytest.approx(43.0) and result.ratio == 0
    assert result.losses == () and result.active
    saved = goodput.compute(attempts, [CheckpointMark(32.0, 30, "/c/step-30")], now=45.0, run_active=True)
    assert saved.kept_s == pytest.approx(30.0) and saved.unsaved_s == pytest.approx(13.0)
    assert saved.ratio == pytest.approx(30.0 / 45.0) and saved.unsaved_steps == 14  # at its rate, step 44 by now


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


def test_a_job_that_reports_no_steps_stalls_from_its_last_sign_of_life_until_its_kill() -> None:
    # Saves its own files (no steps), fell silent at t=30, the hang watchdog killed it at t=40.
    attempts = [
        AttemptRecord(1, 0.0, 40.0, True, "hang", None, {"last_active_time": 30.0}),
        AttemptRecord(2, 45.0, 60.0, False, None, "/c/epoch-2", {}),
    ]
    marks = [CheckpointMark(10.0, None, "/c/epoch-1"), CheckpointMark(20.0, None, "/c/epoch-2")]
    (loss,) = goodput.compute(attempts, marks, now=0.0, run_active=False).losses
    assert loss.stalled_s == pytest.approx(10.0)  # before: 0, its silence counted as training
    assert loss.recomputed_s == pytest.approx(10.0) and loss.measured_by == "checkpoints"
    # A sign of life seen only in its checkpoints: trained at least until its newest one.
    attempts[0] = AttemptRecord(1, 0.0, 40.0, True, "hang", None, {"last_active_time": 5.0})
    (loss,) = goodput.compute(attempts, marks, now=0.0, run_active=False).losses
    assert loss.stalled_s == pytest.approx(20.0) and loss.recomputed_s == pytest.approx(0.0)


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


def test_restarts_of_a_job_that_reports_nothing_cost_their_gaps_and_the_rest_is_unknown() -> None:
    attempts = [AttemptRecord(1, 0.0, 10.0, True, "segfault", None, {}), AttemptRecord(2, 15.0, 30.0, False)]
    result = goodput.compute(attempts, [], now=0.0, run_active=False)
    assert result.ratio is None and result.unknown_s == pytest.approx(25.0) and result.wall_s == pytest.approx(30.0)
    (loss,) = result.losses
    assert loss.restart_s == pytest.approx(5.0) and loss.recomputed_s == 0 and loss.measured_by == "unknown"
    assert goodput.describe(result).endswith("(30 s wall time); lost: 5.0 s restarting")


def test_a_death_while_the_run_backs_off_leaves_its_unsaved_work_unsaved_not_lost() -> None:
    attempts = [AttemptRecord(1, 0.0, 50.0, True, "python_error", None, reported(0, 1.0, 49, 50.0))]
    marks = [CheckpointMark(20.0, 19, "/c/step-19"), CheckpointMark(40.0, 39, "/c/step-39")]
    result = goodput.compute(attempts, marks, now=99.0, run_active=True)
    assert result.recomputed_s == 0 and result.unsaved_s == pytest.approx(10.0) and result.unsaved_steps == 10
    assert result.kept_s == pytest.approx(39.0)


def test_how_a_registry_attempt_ended_comes_from_its_exit_its_reported_stop_and_the_run() -> None:
    def attempt(n: int, exit_code: int | None, cause: str | None = None, **progress: object) -> SimpleNamespace:
        return SimpleNamespace(n=n, started_at=0.0, ended_at=1.0, cause=cause, exit_code=exit_code,
                               resumed_from=None, progress=progress)  # fmt: skip

    done, signalled, saved_and_stopped, died = goodput.attempt_records(
        [attempt(1, 0), attempt(2, None), attempt(3, 0, stop_signal=15), attempt(4, 1, "python_error")]
    )
    assert done.finished and not signalled.finished and signalled.stopped
    assert saved_and_stopped.stopped and died.died and not died.stopped
    # An exit 0 after a stop the job did not report: the run's state says it was a stop.
    (last,) = goodput.attempt_records([attempt(1, 0)], run_state="stopped")
    assert last.stopped and not last.finished
    (last,) = goodput.attempt_records([attempt(1, None)], run_state="succeeded")
    assert last.finished


def test_one_step_is_one_step() -> None:
    loss = goodput.Loss(1, "killed", recomputed_s=0.1, recomputed_steps=1)
    assert "0.1 s recomputed (1 step)," in goodput.describe_loss(loss)
    assert "（1 步）" in goodput.describe_loss(loss, "zh")
    assert goodput.steps_text(1) == "1 step" and goodput.steps_text(2) == "2 steps"
    assert goodput.steps_text(3, "zh") == "3 步"
