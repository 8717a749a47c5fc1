"""Projecting when a resource runs out, and the decisions on it, replayed over recorded-style series
(samples as the registry stores them, with the jitter real readings have): a steady leak and a
filling disk are seen in time; noise, an epoch's rise and fall, a spike and a short history never
trigger."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from trainguard.monitor.alerts import evaluate
from trainguard.monitor.forecast import (
    DISK_PREFIX,
    HOST_MEMORY,
    JOB_MEMORY,
    Projection,
    Reading,
    judge_leak,
    project,
    project_all,
    readings_from_samples,
    sampling_interval,
    should_request_save,
)
from trainguard.monitor.sampler import Sample

MIB, GIB = 2**20, 2**30
T0 = 1_733_000_000.0  # a recorded run's clock: epoch seconds
SAVE_S, MARGIN_S = 3.0, 5.0


def job_samples(rss_at, *, seconds: float, every: float, limit: int = 700 * MIB, seed: int = 0) -> list[Sample]:
    """What the monitor records for a job under `--memory-limit`: its RSS and what its cgroup still has."""
    rng = random.Random(seed)
    found = []
    for k in range(int(seconds / every) + 1):
        t = k * every
        rss = int(rss_at(t, rng))
        found.append(Sample.from_dict({"time": T0 + t, "mem_available": max(0, limit - rss), "mem_total": limit,
                                       "job_rss": rss}))  # fmt: skip
    return found


def replay(samples: list[Sample], resource: str = JOB_MEMORY, *, save_s: float = SAVE_S, margin_s: float = MARGIN_S):
    """Feed the samples one by one as the supervisor would: each time, the projection and whether a save
    would be asked for (remembering the last request) and whether a leak is judged."""
    series = readings_from_samples(samples)[resource]
    last_request = None
    for n in range(1, len(series) + 1):
        now = series[n - 1].time
        projection = project(resource, series[:n])
        asked = should_request_save(projection, save_s, margin_s, last_request, now)
        if asked:
            last_request = now
        yield now, projection, asked, judge_leak(projection, save_s, margin_s)


def test_a_steady_leak_is_met_by_a_save_and_a_planned_restart_in_time() -> None:
    # The case: 20 MB/s under --memory-limit 700M, read every half second (a cgroup is cheap).
    samples = job_samples(lambda t, rng: 150 * MIB + 20 * MIB * t + rng.uniform(-2, 2) * MIB, seconds=30, every=0.5)
    dies_at = T0 + (700 - 150) / 20  # 27.5 s in
    requests = [(now, p, leak) for now, p, asked, leak in replay(samples) if asked]
    assert requests, "the leak was never acted on"
    now, projection, leak = requests[0]
    assert now + SAVE_S < dies_at, "the save must finish before the limit"
    assert now + projection.seconds_to_exhaustion == pytest.approx(dies_at, abs=1.0)
    assert projection.rate_bytes_per_s == pytest.approx(20 * MIB, rel=0.05)
    assert leak is not None and leak.resource == JOB_MEMORY
    assert "20 MiB/s" in leak.evidence and "700 MiB" in leak.evidence
    # a save was asked once, then not again until that save and its margin had passed
    times = [now for now, _, _ in requests]
    assert all(b - a >= SAVE_S + MARGIN_S for a, b in pairwise(times))


def test_a_leak_is_the_jobs_memory_not_a_filling_disk() -> None:
    # A checkpoint disk filling 50 MiB/s (a writer beside the job), read every 5 s; the next checkpoint needs 2 GiB.
    rng = random.Random(1)
    samples = [Sample(time=T0 + t, disk_free={"/ckpt": int(40 * GIB - 50 * MIB * t + rng.uniform(-8, 8) * MIB)})
               for t in range(0, 900, 5)]  # fmt: skip
    save_s, margin_s, reserve = 60.0, 30.0, 2 * GIB
    full_at = T0 + (40 * GIB - reserve) / (50 * MIB)
    last, asked_at = None, []
    for n in range(1, len(samples) + 1):
        now = samples[n - 1].time
        projection = project_all(samples[:n], reserve_bytes={DISK_PREFIX + "/ckpt": reserve}).get("disk:/ckpt")
        if should_request_save(projection, save_s, margin_s, last, now):
            last = now
            asked_at.append((now, projection))
        assert judge_leak(projection, save_s, margin_s) is None  # saving, not restarting, is the answer
    now, projection = asked_at[0]
    assert now + save_s < full_at and full_at - now <= save_s + margin_s + 5
    assert now + projection.seconds_to_exhaustion == pytest.approx(full_at, abs=10)


def test_noisy_flat_memory_never_triggers() -> None:
    samples = job_samples(lambda t, rng: 400 * MIB + rng.gauss(0, 25) * MIB, seconds=600, every=1.0, seed=2)
    assert all(p is None and not asked and leak is None for _, p, asked, leak in replay(samples))


def test_an_epochs_rise_and_fall_for_ten_minutes_never_triggers() -> None:
    def epoch(t: float, rng: random.Random) -> float:
        # Each 2-minute epoch: memory climbs 220 MiB as batches and caches fill, then the end of the
        # epoch frees it over 30 s; 5 MiB of jitter.
        phase = t % 120
        climb = 220 * phase / 90 if phase < 90 else 220 * (120 - phase) / 30
        return 300 * MIB + climb * MIB + rng.uniform(-5, 5) * MIB

    samples = job_samples(epoch, seconds=600, every=1.0, seed=3)
    outcomes = list(replay(samples))
    assert not any(asked or leak for _, _, asked, leak in outcomes)

    def slow_epoch(t: float, rng: random.Random) -> float:  # one rise over 5 minutes to 600 MiB and back
        return (300 + (t if t < 300 else 600 - t)) * MIB + rng.uniform(-3, 3) * MIB

    assert not any(asked or leak for _, _, asked, leak in replay(job_samples(slow_epoch, seconds=600, every=1.0)))


@pytest.mark.parametrize("at", [120, 299])
def test_a_single_spike_never_triggers(at: int) -> None:
    def spike(t: float, rng: random.Random) -> float:
        return (690 if t == at else 400 + rng.uniform(-3, 3)) * MIB

    samples = job_samples(spike, seconds=299, every=1.0, seed=4)
    assert all(p is None and not asked for _, p, asked, _ in replay(samples))


def test_too_little_history_never_triggers() -> None:
    leak = [Reading(T0 + t, 150 * MIB + 20 * MIB * t, 700 * MIB) for t in range(6)]  # 6 readings in 5 s
    assert project(JOB_MEMORY, leak) is None
    sparse = [Reading(T0 + t, 150 * MIB + 20 * MIB * t, 700 * MIB) for t in (0, 5, 10, 15, 20)]  # 5 readings
    assert project(JOB_MEMORY, sparse) is None
    assert project(JOB_MEMORY, []) is None
    enough = [Reading(T0 + t, 150 * MIB + 20 * MIB * t, 700 * MIB) for t in range(12)]
    assert project(JOB_MEMORY, enough).seconds_to_exhaustion == pytest.approx((700 - 370) / 20)  # 370 MiB at 11 s


def test_a_growth_that_began_lately_is_seen_through_the_flat_history_before_it() -> None:
    flat_then_leak = [Reading(T0 + t, (300 + 20 * max(0, t - 100)) * MIB, 900 * MIB) for t in range(0, 121)]
    projection = project(JOB_MEMORY, flat_then_leak)
    assert projection is not None and projection.rate_bytes_per_s == pytest.approx(20 * MIB)
    assert projection.seconds_to_exhaustion == pytest.approx(10.0)


def test_requests_are_never_more_often_than_a_save_can_finish() -> None:
    due = Projection(JOB_MEMORY, 20 * MIB, 6.0, 580 * MIB, 700 * MIB, 20.0, 40, 0.99, "")
    far = Projection(JOB_MEMORY, 1 * MIB, 600.0, 100 * MIB, 700 * MIB, 100.0, 40, 0.99, "")
    assert should_request_save(due, 3.0, 5.0, None, T0)
    assert not should_request_save(due, 3.0, 5.0, T0, T0 + 2.0)  # the save asked for is still running
    assert not should_request_save(due, 3.0, 5.0, T0, T0 + 7.9)
    assert should_request_save(due, 3.0, 5.0, T0, T0 + 8.0)
    assert not should_request_save(far, 3.0, 5.0, None, T0)
    assert not should_request_save(None, 3.0, 5.0, None, T0)


def test_sampling_speeds_up_as_the_limit_nears() -> None:
    limit = 700 * MIB
    far = sampling_interval(Reading(T0, 100 * MIB, limit), None)
    half = sampling_interval(Reading(T0, 400 * MIB, limit), None)
    near = sampling_interval(Reading(T0, 650 * MIB, limit), None)
    assert far == 5.0 and far > half > near >= 0.25
    soon = Projection(JOB_MEMORY, 20 * MIB, 2.0, 300 * MIB, limit, 20.0, 40, 0.99, "")
    assert sampling_interval(Reading(T0, 300 * MIB, limit), soon) == 0.25  # 20 readings before the end: clamped
    later = Projection(JOB_MEMORY, 1 * MIB, 60.0, 300 * MIB, limit, 60.0, 40, 0.99, "")
    assert sampling_interval(Reading(T0, 300 * MIB, limit), later) == pytest.approx(3.0)
    assert sampling_interval(None, None, slowest_s=1.0) == 1.0


def test_every_resource_of_a_sample_becomes_a_series() -> None:
    sample = Sample.from_dict({"time": T0, "mem_available": 4 * GIB, "mem_total": 16 * GIB, "job_rss": 3 * GIB,
                               "shm_used": GIB, "shm_total": 8 * GIB, "disk_free": {"/ckpt": 100 * GIB},
                               "gpus": [{"index": 0, "memory_used": 30 * GIB, "memory_total": 80 * GIB}]})  # fmt: skip
    series = readings_from_samples([sample])
    assert series[HOST_MEMORY] == [Reading(T0, 12 * GIB, 16 * GIB)]
    assert series[JOB_MEMORY] == [Reading(T0, 3 * GIB, 7 * GIB)]  # what it holds plus what it may still take
    assert series["shm"] == [Reading(T0, GIB, 8 * GIB)]
    assert series["disk:/ckpt"][0].limit - series["disk:/ckpt"][0].used == 100 * GIB
    assert series["gpu0"] == [Reading(T0, 30 * GIB, 80 * GIB)]


def _host(t: float, available: float, rss: float | None = None) -> Sample:
    return Sample(time=T0 + t, mem_available=int(available), mem_total=24 * GIB,
                  job_rss=int(rss) if rss is not None else None)  # fmt: skip


def test_a_test_suite_on_a_24_gib_machine_raises_no_ram_trend_alert() -> None:
    # Issue 18: "RAM falling: runs out in 4 min (20.2 GiB left)" fired on a 24 GiB machine while a
    # test suite ran. Its start: 2.8 GiB taken in 30 s (a least-squares line through these 7 samples
    # reaches zero in 4 min). Then tests come and go: each holds 0.2-1.5 GiB for 2-20 s.
    start = [_host(t, 23 * GIB - t * 0.093 * GIB, rss=2 * GIB) for t in range(0, 35, 5)]
    assert "host_memory_trend" not in {a.rule for a in evaluate(start)}
    rng = random.Random(5)
    tests = [(t, t + rng.uniform(2, 20), rng.uniform(0.2, 1.5) * GIB) for t in range(30, 630, 3)]
    suite = [_host(t, 20.2 * GIB - sum(held for began, ended, held in tests if began <= t < ended), rss=2 * GIB)
             for t in range(35, 630, 5)]  # fmt: skip
    history = start + suite
    for n in range(len(start), len(history) + 1):
        assert "host_memory_trend" not in {a.rule for a in evaluate(history[:n])}, history[n - 1].time - T0


def test_the_ram_trend_alert_says_whose_memory_grows() -> None:
    # 0.02 GiB/s falling for 4 minutes: 20 GiB left -> gone in under 10 minutes is not it; 6 GiB left is.
    job_grows = [_host(t, (10 - 0.02 * t) * GIB, rss=(2 + 0.02 * t) * GIB) for t in range(0, 240, 5)]
    alert = next(a for a in evaluate(job_grows) if a.rule == "host_memory_trend")
    assert "the job's own memory grows" in alert.en and "作业自身的内存每秒增长" in alert.zh
    others = [_host(t, (10 - 0.02 * t) * GIB, rss=2 * GIB) for t in range(0, 240, 5)]
    alert = next(a for a in evaluate(others) if a.rule == "host_memory_trend")
    assert "other processes take it" in alert.en and "其他进程" in alert.zh
