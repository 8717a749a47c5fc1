"""How often to save (``every="auto"``): the Young–Daly interval from what a save costs and how often the
job dies, and the mean time between failures estimated from the attempts of this run and this machine,
with a stated prior before there is any history. Pure: numbers and records in, an interval and its
reason out."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from trainguard._i18n import Text
from trainguard.units import format_duration

# With no history, one failure a day: the longest a preemptible VM lives (GCP stops them after 24 h),
# and far shorter than a large cluster's node (Llama 3's 419 unexpected interruptions in 54 days over
# 2,048 eight-GPU nodes: months per node), because the deaths a single machine sees are mostly OOM kills,
# spot reclaims, dropped sessions and NCCL errors. Erring short costs a few extra saves; erring long
# costs hours per death. It counts as one failure over that long: real history outweighs it soon.
DEFAULT_MTBF_S = 24 * 3600.0
PRIOR_FAILURES = 1
DEFAULT_LOWER_S = 60.0  # more often than once a minute, saving is the training
DEFAULT_UPPER_S = 4 * 3600.0  # a rare death, or an MTBF guessed too long, still costs at most this
# Endings that cost no work since the last save: it saved first (a planned leak restart) or never
# started training (a bad command). An ending with no cause succeeded or was stopped on request.
NOT_FAILURES = frozenset({"memory_leak", "bad_command"})


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as the estimate needs it: when it ran and what ended it."""

    start: float  # seconds since the epoch
    end: float | None  # None while it runs
    cause: str | None  # None: succeeded, or stopped on request


@dataclass(frozen=True)
class MtbfEstimate:
    seconds: float
    failures: int
    exposure_s: float  # the running time observed
    why: Text


def estimate_mtbf(attempts: Iterable[AttemptRecord], *, now: float | None = None,
                  prior_mtbf_s: float = DEFAULT_MTBF_S) -> MtbfEstimate:  # fmt: skip
    """The mean time between failures: observed running time over observed failures, each side
    given the prior's one failure in ``prior_mtbf_s`` (the posterior mean under a gamma prior), so
    that a run with no history gets the prior and one early death does not make every minute a
    save. ``attempts``: this run's and this machine's other runs', each counted once; one still
    running counts up to ``now`` when it is given."""
    if prior_mtbf_s <= 0:
        raise ValueError(f"prior_mtbf_s must be positive: {prior_mtbf_s!r}")
    exposure, failures = 0.0, 0
    for attempt in attempts:
        end = attempt.end if attempt.end is not None else now
        if end is None:
            continue
        exposure += max(0.0, end - attempt.start)
        if attempt.end is not None and attempt.cause is not None and attempt.cause not in NOT_FAILURES:
            failures += 1
    seconds = (exposure + PRIOR_FAILURES * prior_mtbf_s) / (failures + PRIOR_FAILURES)
    prior = format_duration(prior_mtbf_s)
    if failures == 0 and exposure == 0:
        why = Text(f"no history yet: the default of one failure in {prior}",
                   f"尚无历史：采用默认值，每 {prior} 一次故障")  # fmt: skip
    else:
        ran = format_duration(exposure)
        counted = "1 failure" if failures == 1 else f"{failures} failures"
        why = Text(f"{counted} in {ran} of running, with a prior of one in {prior}",
                   f"运行 {ran} 中发生 {failures} 次故障，先验为每 {prior} 一次")  # fmt: skip
    return MtbfEstimate(seconds, failures, exposure, why)


def checkpoint_interval(save_cost_s: float, mtbf_s: float, *, lower_s: float = DEFAULT_LOWER_S,
                        upper_s: float = DEFAULT_UPPER_S) -> tuple[float, Text]:  # fmt: skip
    """Seconds of training between saves that lose the least to saves and deaths together (Young's
    rule, which Daly refined: sqrt(2 × save cost × MTBF)), kept within [lower_s, upper_s]. The save
    cost is the time a save blocks training."""
    if mtbf_s <= 0 or lower_s <= 0 or upper_s < lower_s:
        raise ValueError(f"need mtbf_s > 0 and 0 < lower_s <= upper_s: {mtbf_s!r}, {lower_s!r}, {upper_s!r}")
    cost, mtbf = format_duration(max(0.0, save_cost_s)), format_duration(mtbf_s)
    ideal = math.sqrt(2 * max(0.0, save_cost_s) * mtbf_s)
    en = f"sqrt(2 × {cost} per save × {mtbf} between failures) = {format_duration(ideal)}"
    zh = f"sqrt(2 × 每次保存 {cost} × 平均 {mtbf} 一次故障) = {format_duration(ideal)}"
    if ideal < lower_s:
        bound = format_duration(lower_s)
        return lower_s, Text(f"{en}, raised to the shortest, {bound}", f"{zh}，提高到下限 {bound}")
    if ideal > upper_s:
        bound = format_duration(upper_s)
        return upper_s, Text(f"{en}, capped at the longest, {bound}", f"{zh}，限制为上限 {bound}")
    return ideal, Text(en, zh)
