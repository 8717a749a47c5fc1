"""``every="auto"``: the Young–Daly interval from the save cost and the MTBF, bounded, and the MTBF from
the attempts of this run and this machine, with the default prior before there is any history."""

from __future__ import annotations

import math

import pytest

from trainguard.checkpoint.interval import (
    DEFAULT_LOWER_S,
    DEFAULT_MTBF_S,
    DEFAULT_UPPER_S,
    AttemptRecord,
    checkpoint_interval,
    estimate_mtbf,
)

HOUR = 3600.0


def test_the_interval_is_sqrt_of_twice_the_save_cost_times_the_mtbf() -> None:
    interval, why = checkpoint_interval(60.0, 24 * HOUR)
    assert interval == pytest.approx(math.sqrt(2 * 60 * 24 * HOUR))  # 53m40s
    assert why.en == "sqrt(2 × 1m00s per save × 1d00h between failures) = 53m40s"
    assert "53m40s" in why.zh
    # four times the save cost or the MTBF: twice the interval
    assert checkpoint_interval(240.0, 24 * HOUR)[0] == pytest.approx(2 * interval)
    assert checkpoint_interval(60.0, 96 * HOUR)[0] == pytest.approx(2 * interval)


def test_the_interval_is_kept_within_its_bounds_and_says_so() -> None:
    cheap, why = checkpoint_interval(0.1, 600.0)  # sqrt(2 × 0.1 × 600) = 11 s
    assert cheap == DEFAULT_LOWER_S and "raised to the shortest, 1m00s" in why.en and "下限" in why.zh
    costly, why = checkpoint_interval(600.0, 30 * 24 * HOUR)  # sqrt(2 × 600 × 30 d) = 50 h
    assert costly == DEFAULT_UPPER_S and "capped at the longest, 4h00m" in why.en and "上限" in why.zh
    assert checkpoint_interval(0.0, HOUR, lower_s=30.0, upper_s=90.0)[0] == 30.0  # a save too quick to measure
    assert checkpoint_interval(5.0, HOUR, lower_s=10.0, upper_s=1000.0)[0] == pytest.approx(math.sqrt(2 * 5 * HOUR))
    with pytest.raises(ValueError):
        checkpoint_interval(5.0, 0.0)
    with pytest.raises(ValueError):
        checkpoint_interval(5.0, HOUR, lower_s=100.0, upper_s=10.0)


def test_with_no_history_the_mtbf_is_the_stated_default() -> None:
    estimate = estimate_mtbf([])
    assert estimate.seconds == DEFAULT_MTBF_S == 24 * HOUR
    assert (estimate.failures, estimate.exposure_s) == (0, 0.0)
    assert "no history yet" in estimate.why.en and "1d00h" in estimate.why.en and "尚无历史" in estimate.why.zh
    assert estimate_mtbf([], prior_mtbf_s=6 * HOUR).seconds == 6 * HOUR


def test_the_mtbf_counts_the_deaths_that_cost_work_over_the_time_run() -> None:
    attempts = [
        AttemptRecord(0.0, 2 * HOUR, "host_oom"),
        AttemptRecord(2 * HOUR, 5 * HOUR, "nccl_failure"),
        AttemptRecord(5 * HOUR, 6 * HOUR, "memory_leak"),  # saved first, then restarted: no work lost
        AttemptRecord(6 * HOUR, 6 * HOUR + 1, "bad_command"),  # never trained
        AttemptRecord(7 * HOUR, 9 * HOUR, None),  # another run on this machine that succeeded
    ]
    estimate = estimate_mtbf(attempts)
    assert estimate.failures == 2
    assert estimate.exposure_s == pytest.approx(8 * HOUR + 1)
    # one prior failure in 24 h with the history: (8 h + 24 h) / (2 + 1)
    assert estimate.seconds == pytest.approx((8 * HOUR + 1 + 24 * HOUR) / 3)
    assert estimate.why.en.startswith("2 failures in 8h00m of running")


def test_history_outweighs_the_prior_as_it_grows() -> None:
    flaky = [AttemptRecord(k * HOUR, (k + 1) * HOUR, "preempted") for k in range(48)]  # a death an hour for 2 days
    assert estimate_mtbf(flaky).seconds == pytest.approx((48 + 24) / 49 * HOUR)
    steady = [AttemptRecord(0.0, 14 * 24 * HOUR, None)]  # two weeks without a death
    assert estimate_mtbf(steady).seconds == pytest.approx(15 * 24 * HOUR)
    assert estimate_mtbf([AttemptRecord(0.0, HOUR, "hang")]).why.en.startswith("1 failure in")


def test_an_attempt_still_running_counts_up_to_now_when_given() -> None:
    running = [AttemptRecord(0.0, HOUR, "killed"), AttemptRecord(HOUR, None, None)]
    assert estimate_mtbf(running).exposure_s == HOUR
    assert estimate_mtbf(running, now=3 * HOUR).exposure_s == 3 * HOUR
    with pytest.raises(ValueError):
        estimate_mtbf([], prior_mtbf_s=0)
