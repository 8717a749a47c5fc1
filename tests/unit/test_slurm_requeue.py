"""Whether `run --requeue` asks Slurm to requeue the job: pure, on `scontrol show job -o` records
captured from a real Slurm 22.05 (tests/data/slurm) at the moment a run in the job ends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainguard.integrations.slurm import parse_duration, parse_job, requeue_decision, restart_count

RECORDS = Path(__file__).resolve().parents[1] / "data" / "slurm" / "scontrol_show_job.txt"


def _records() -> dict[str, tuple[str, int]]:
    found = {}
    for header, record in re.findall(r"^## (.+)\n(JobId=.*)$", RECORDS.read_text(), re.M):
        name, own = header.split()
        found[name] = (record, int(own.split("=")[1]))
    return found


CASES = _records()


def _decide(case: str, verdict: int = 75):
    record, own = CASES[case]
    return requeue_decision(verdict, parse_job(record), own)


def test_the_records_parse() -> None:
    assert set(CASES) == {"running", "time_limit", "preempted", "cancelled", "cancelled_after_a_requeue",
                          "requeued_from_outside"}  # fmt: skip
    job = parse_job(CASES["time_limit"][0])
    assert (job.job_id, job.state, job.reason, job.restarts) == ("1", "COMPLETING", "TimeLimit", 0)
    assert job.run_time_s == 88 and job.time_limit_s == 60 and job.batch


def test_a_running_job_is_requeued() -> None:
    """The pre-timeout save, a preemption's grace time, a failure the local retries could not cure."""
    assert _decide("running").ask


def test_a_job_killed_at_its_time_limit_is_requeued() -> None:
    decision = _decide("time_limit")
    assert decision.ask and "time limit" in decision.why.en and "时间上限" in decision.why.zh


def test_a_preempted_job_is_requeued() -> None:
    """PreemptMode=CANCEL: Slurm shows it COMPLETING like a cancel; its PreemptTime tells them apart."""
    decision = _decide("preempted")
    assert parse_job(CASES["preempted"][0]).preempted and not parse_job(CASES["cancelled"][0]).preempted
    assert decision.ask and "preempted" in decision.why.en and "抢占" in decision.why.zh


@pytest.mark.parametrize("case", ["cancelled", "cancelled_after_a_requeue"])
def test_a_scancel_is_not_undone(case: str) -> None:
    decision = _decide(case)
    assert not decision.ask and "cancelled" in decision.why.en and "取消" in decision.why.zh


def test_a_job_slurm_already_requeued_is_not_asked_for_twice() -> None:
    decision = _decide("requeued_from_outside")
    assert not decision.ask and "already been requeued" in decision.why.en


@pytest.mark.parametrize("verdict", [0, 78, 1])
def test_only_a_verdict_of_75_is_requeued(verdict: int) -> None:
    decision = _decide("running", verdict)
    assert not decision.ask
    if verdict == 78:
        assert "needs a fix first" in decision.why.en


def test_an_unreadable_job_is_asked_for_anyway_and_slurm_decides() -> None:
    assert requeue_decision(75, None, 0).ask
    assert parse_job("") is None and parse_job("slurm_load_jobs error: Invalid job id specified") is None


def test_an_interactive_allocation_is_not_requeued() -> None:
    record = CASES["running"][0].replace("BatchFlag=1", "BatchFlag=0")
    assert not requeue_decision(75, parse_job(record), 0).ask


def test_slurm_durations_and_restart_counts() -> None:
    assert parse_duration("00:01:00") == 60 and parse_duration("1-02:03:04") == 93784 and parse_duration("05:00") == 300
    assert parse_duration("UNLIMITED") is None and parse_duration("Partition_Limit") is None
    assert restart_count({"SLURM_RESTART_COUNT": "2"}) == 2 and restart_count({}) == 0
    assert restart_count({"SLURM_RESTART_COUNT": "x"}) == 0


def test_the_example_batch_script_has_the_shape_the_slurm_tests_run() -> None:
    """tests/slurm/test_slurm_real.py runs this shape on a real Slurm; the example must keep it."""
    import shlex

    from trainguard.cli.runs import run

    example = (Path(__file__).resolve().parents[2] / "examples" / "slurm-train.sbatch").read_text()
    for line in ("#SBATCH --signal=B:USR1@", "#SBATCH --requeue", "#SBATCH --open-mode=append"):
        assert re.search(f"^{re.escape(line)}", example, re.M), line
    command = re.search(r"^exec (trainguard run .*?[^\\])$", example.replace("\\\n", " "), re.M | re.S).group(1)
    argv = shlex.split(command.replace('"vit-$SLURM_JOB_ID"', "vit-1").replace('"/scratch/$USER/ckpt/vit"', "/ckpt"))
    params = run.make_context("run", argv[2:]).params
    assert params["foreground"] and params["requeue"] and params["name"] == "vit-1" and params["grace"] < 30
