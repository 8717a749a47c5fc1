"""The restart policy, the state machine and what each attempt is given: pure functions of data."""

from __future__ import annotations

import pytest

from trainguard.causes import Retry, catalogue
from trainguard.store.states import IllegalTransition, RunState, check_transition
from trainguard.supervisor.job import job_argv, job_environment
from trainguard.supervisor.policy import Outcome, RestartPolicy, decide

CAUSES = catalogue()


def died(cause: str, *, progressed: bool = True, code: int | None = 1, confidence: float = 0.9) -> Outcome:
    return Outcome(exit_code=code, signal=None, cause=cause, new_lines=100 if progressed else 0, confidence=confidence)


def test_causes_worth_a_retry_restart_and_the_others_do_not() -> None:
    policy = RestartPolicy()
    assert decide([died("host_oom")], policy, CAUSES).restart
    assert decide([died("preempted")], policy, CAUSES).restart
    for hopeless in ("python_error", "shm_exhausted", "disk_full", "cuda_driver_mismatch", "too_many_open_files"):
        decision = decide([died(hopeless)], policy, CAUSES)
        assert not decision.restart and decision.final_state == "failed", hopeless


def test_cuda_oom_halves_the_batch_scale_and_hardware_waits() -> None:
    assert decide([died("cuda_oom")], RestartPolicy(), CAUSES).batch_scale == 0.5
    assert decide([died("gpu_hardware")], RestartPolicy(), CAUSES).delay_s >= 60


def test_once_causes_are_retried_once_in_a_row() -> None:
    assert decide([died("segfault")], RestartPolicy(), CAUSES).restart
    assert not decide([died("segfault"), died("segfault")], RestartPolicy(), CAUSES).restart


def test_a_cause_that_ends_the_run_is_acted_on_only_when_the_diagnosis_is_sure_of_it() -> None:
    """A guess of python_error (a generic exception line) on a host OOM would end a run that a restart
    saves; a wrong restart costs one attempt. So an unsure one is restarted once, then ends it."""
    guess = decide([died("python_error", confidence=0.3)], RestartPolicy(), CAUSES)
    assert guess.restart and "not sure enough to end the run" in guess.reason.en and "重启一次" in guess.reason.zh
    again = decide([died("python_error", confidence=0.3), died("python_error", confidence=0.3)], RestartPolicy(), CAUSES)
    assert not again.restart and again.final_state == "failed"
    assert not decide([died("python_error", confidence=0.5)], RestartPolicy(), CAUSES).restart
    # The user's own --retry CAUSE=no is obeyed however unsure the diagnosis is.
    told = RestartPolicy(retry_overrides={"python_error": Retry.NO})
    assert not decide([died("python_error", confidence=0.3)], told, CAUSES).restart


def test_user_overrides_per_cause() -> None:
    policy = RestartPolicy(retry_overrides={"python_error": Retry.YES, "nccl_failure": Retry.NO})
    assert decide([died("python_error")], policy, CAUSES).restart
    assert not decide([died("nccl_failure")], policy, CAUSES).restart


def test_max_restarts_and_never() -> None:
    assert not decide([died("host_oom")] * 3, RestartPolicy(max_restarts=2), CAUSES).restart
    assert not decide([died("host_oom")], RestartPolicy(mode="never"), CAUSES).restart


def test_a_crash_loop_without_progress_ends_the_run_with_the_reason() -> None:
    history = [died("host_oom", progressed=False)] * 3
    decision = decide(history, RestartPolicy(), CAUSES)
    assert not decision.restart and "crash loop" in decision.reason.en and "崩溃循环" in decision.reason.zh
    # progress in between resets the count
    assert decide([died("host_oom", progressed=False), died("host_oom"), died("host_oom", progressed=False)],
                  RestartPolicy(), CAUSES).restart  # fmt: skip


def test_backoff_grows_and_is_capped() -> None:
    policy = RestartPolicy(backoff_base_s=2, backoff_cap_s=5)
    delays = [decide([died("preempted", progressed=False)] * k, policy, CAUSES).delay_s for k in (1, 2)]
    assert delays == [2, 4]
    capped = decide([died("preempted", progressed=False)] * 2, RestartPolicy(backoff_base_s=2, backoff_cap_s=3), CAUSES)
    assert capped.delay_s == 3


def test_a_stop_we_asked_for_is_never_a_crash_and_success_ends() -> None:
    stopped = Outcome(exit_code=None, signal=15, cause=None, stopped_by_user=True)
    assert decide([stopped], RestartPolicy(mode="always"), CAUSES).final_state == "stopped"
    ok = Outcome(exit_code=0, signal=None, cause=None)
    assert decide([ok], RestartPolicy(), CAUSES).final_state == "succeeded"
    assert decide([ok], RestartPolicy(mode="always"), CAUSES).restart


def test_illegal_transitions_raise() -> None:
    check_transition(RunState.RUNNING, RunState.BACKOFF)
    with pytest.raises(IllegalTransition):
        check_transition(RunState.SUCCEEDED, RunState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(RunState.STOPPING, RunState.RUNNING)


def test_the_job_environment_and_resume_argument() -> None:
    env = job_environment({"PATH": "/bin", "PYTHONUNBUFFERED": "0", "TRAINGUARD_RESUME_FROM": "stale"},
                          run_id="ab12", attempt=2, restart_cause="cuda_oom", checkpoint_dir="/ck",
                          resume_from=None, batch_scale=0.5, error_file="/e.json", progress_file="/p.json")  # fmt: skip
    assert env["TRAINGUARD_ATTEMPT"] == "2" and env["TRAINGUARD_RESTART_CAUSE"] == "cuda_oom"
    assert env["TRAINGUARD_BATCH_SCALE"] == "0.5" and "TRAINGUARD_RESUME_FROM" not in env
    assert env["PYTHONUNBUFFERED"] == "0" and env["PYTHONFAULTHANDLER"] == "1"  # the user's choice stays
    assert job_argv(("python", "train.py"), "--resume {checkpoint}", "/ck/step-1") == [
        "python", "train.py", "--resume", "/ck/step-1"]  # fmt: skip
    assert job_argv(("python", "train.py"), "--resume {checkpoint}", None) == ["python", "train.py"]


def leaked(*, progressed: bool = True) -> Outcome:
    # A planned restart: trainguard saw the job's memory grow toward its limit, had it save and exit.
    return Outcome(exit_code=0, signal=None, cause="memory_leak", new_checkpoint=progressed)


def test_a_leak_is_restarted_at_once_within_its_own_budget() -> None:
    budget = CAUSES["memory_leak"].restart_budget
    assert budget == 5
    first = decide([leaked()], RestartPolicy(), CAUSES)
    assert first.restart and first.delay_s == 0 and first.batch_scale == 1.0
    assert decide([leaked()] * budget, RestartPolicy(), CAUSES).restart
    # each attempt saved before the limit, so no crash loop is ever seen: the budget ends the run
    spent = decide([leaked()] * (budget + 1), RestartPolicy(), CAUSES)
    assert not spent.restart and spent.final_state == "failed"
    assert "memory_leak" in spent.reason.en and "every restart" in spent.reason.en and "复发" in spent.reason.zh


def test_the_leak_budget_counts_leaks_across_other_deaths_and_can_be_set() -> None:
    mixed = [leaked(), died("preempted"), leaked(), died("nccl_failure"), leaked()]
    assert decide(mixed, RestartPolicy(), CAUSES).restart  # 2 leak restarts spent of 5
    assert not decide(mixed, RestartPolicy(restart_budgets={"memory_leak": 2}), CAUSES).restart
    assert decide([leaked()] * 7, RestartPolicy(restart_budgets={"memory_leak": 10}), CAUSES).restart
    # the other deaths of the run are not charged to it, and --max-restarts still caps them all
    assert decide([leaked()] * 5 + [died("preempted")], RestartPolicy(), CAUSES).restart
    assert not decide([leaked()] * 3, RestartPolicy(max_restarts=2), CAUSES).restart
    assert not decide([leaked()], RestartPolicy(retry_overrides={"memory_leak": Retry.NO}), CAUSES).restart
