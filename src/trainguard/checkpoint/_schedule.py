"""When ``Checkpointer``'s next periodic save is due: every so many seconds (``every``) or steps
(``every_steps``), and the save that fell due while the previous one was still being written,
postponed to a later step and taken at the latest by ``wait()``.

``every="auto"``: the period that loses the least training to saves and deaths together, the
Young–Daly interval of ``interval.checkpoint_interval``, from what this job's own saves cost (the
time a save blocks training: the state's copy into the staging buffer, not the writer's
asynchronous write; the mean of the last ``COSTS_KEPT``) and the mean time between failures in
``TRAINGUARD_MTBF_S`` (which the supervisor sets from the run's and the machine's history), else the
stated default of ``interval``. Before the first save is measured the period is the shortest one.
Recomputed after each save and reported through ``progress`` (``checkpoint_interval_s`` and why),
so ``trainguard status`` can show it."""

from __future__ import annotations

import collections
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from trainguard import progress
from trainguard._i18n import Text
from trainguard.checkpoint.interval import DEFAULT_LOWER_S, checkpoint_interval, estimate_mtbf
from trainguard.units import format_duration, parse_duration

log = logging.getLogger("trainguard.checkpoint")

AUTO = "auto"
MTBF_ENV = "TRAINGUARD_MTBF_S"
COSTS_KEPT = 5  # the first save also pays for the staging buffer: one measurement must not decide
_NUMBER = re.compile(r"^\s*[0-9.]+(?:e[+-]?[0-9]+)?\s*$", re.IGNORECASE)  # seconds, "86400" or "8.64e4"


def mtbf_from(environ: Mapping[str, str]) -> tuple[float, Text]:
    """The mean time between failures to plan for, and where it comes from."""
    raw = environ.get(MTBF_ENV)
    default = estimate_mtbf(())
    if raw:
        try:
            seconds = float(raw) if _NUMBER.match(raw) else parse_duration(raw)
            if not 0 < seconds < math.inf:
                raise ValueError(raw)
        except ValueError:
            log.warning('%s=%r is not a duration: every="auto" plans for the default MTBF', MTBF_ENV, raw)
        else:
            shown = format_duration(seconds)
            return seconds, Text(f"MTBF {shown} from {MTBF_ENV} (the run's and the machine's history)",
                                 f"平均故障间隔 {shown}，来自 {MTBF_ENV}（本次运行与本机的历史）")  # fmt: skip
    return default.seconds, Text(f"MTBF: {default.why.en}", f"平均故障间隔：{default.why.zh}")


class SaveSchedule:
    """The periods of one Checkpointer, the step and time of its last save, and a postponed save."""

    def __init__(self, every: float | str | None, every_steps: int | None, *, sharded: bool,
                 clock: Callable[[], float], environ: Mapping[str, str] = os.environ) -> None:  # fmt: skip
        self.auto = every == AUTO
        self.every_steps = every_steps
        self.sharded = sharded
        self._clock = clock
        self.last_time = clock()
        self.last_step: int | None = None
        self.postponed: tuple[int, Any] | None = None  # (step, state) of the newest due save not taken
        self.why: Text | None = None  # why every="auto" chose ``every_s``
        self._costs: collections.deque[float] = collections.deque(maxlen=COSTS_KEPT)
        self.every_s: float | None = None
        if self.auto:
            self._mtbf_s, self._mtbf_why = mtbf_from(environ)
            self.every_s = self._choose()
        else:
            self.every_s = None if every is None else parse_duration(every)

    # ------------------------------------------------------------------ due
    def steps_due(self, step: int) -> bool:
        if self.every_steps is None:
            return False
        last = self.last_step if self.last_step is not None else -1
        if self.sharded:
            # Every rank must save the same steps for a step to complete: periods are counted
            # from step 0, not from this rank's last save, so a save that came late on one rank
            # (its writer was still busy) costs that period alone, never every later one.
            return (step + 1) // self.every_steps > (last + 1) // self.every_steps
        return step - last >= self.every_steps

    def time_due(self) -> bool:
        return self.every_s is not None and self._clock() - self.last_time >= self.every_s

    # ------------------------------------------------------------------ saves
    def saving(self, step: int) -> None:
        """A save of ``step`` starts now: the periods count from it, and it answers any postponed one."""
        self.last_time = self._clock()
        self.last_step = step
        if self.postponed is not None and step >= self.postponed[0]:
            self.postponed = None

    def resumed(self, step: int) -> None:
        self.last_step = step
        self.last_time = self._clock()

    def postpone(self, step: int, state: Any) -> None:
        """A due save of ``step`` waits for the writer: the newest one is taken later."""
        self.postponed = (step, state)

    def take_postponed(self) -> tuple[int, Any] | None:
        found, self.postponed = self.postponed, None
        return found

    def measured(self, blocked_s: float) -> None:
        """A periodic save blocked training for ``blocked_s``: every="auto" chooses its period again."""
        if self.auto:
            self._costs.append(max(0.0, blocked_s))
            self.every_s = self._choose()

    # ------------------------------------------------------------------ every="auto"
    def _choose(self) -> float:
        if not self._costs:
            seconds = DEFAULT_LOWER_S
            shown = format_duration(seconds)
            why = Text(f"no save measured yet: the shortest interval, {shown}, until one is; {self._mtbf_why.en}",
                       f"尚未测得保存耗时：先用最短间隔 {shown}；{self._mtbf_why.zh}")  # fmt: skip
        else:
            cost = sum(self._costs) / len(self._costs)
            seconds, rule = checkpoint_interval(cost, self._mtbf_s)
            saves = f"the last {len(self._costs)} saves" if len(self._costs) > 1 else "the last save"
            why = Text(f"{rule.en}; the cost of a save: how long {saves} blocked training; {self._mtbf_why.en}",
                       f"{rule.zh}；每次保存的代价：最近 {len(self._costs)} 次保存阻塞训练的平均时间；"
                       f"{self._mtbf_why.zh}")  # fmt: skip
        if self.every_s is None or abs(seconds - self.every_s) >= 1.0:
            log.info('every="auto": a save every %s (%s)', format_duration(seconds), why.en)
        self.why = why
        progress.report_checkpoint_interval(seconds, why.en, why.zh)
        return seconds
