"""Where a run's output is on disk: one fresh file per attempt (``attempt-N.log``), ``output.log`` a
symlink to the current one. Runs recorded by an older trainguard kept every attempt in one
``output.log`` at recorded offsets; both are read here, so `logs`, `diagnose` and `report` never
need to know which."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime

from trainguard.store.registry import Attempt, Run


@dataclass(frozen=True)
class LogRegion:
    path: str
    start: int = 0
    end: int | None = None  # None: to the end of the file

    def exists(self) -> bool:
        return os.path.exists(self.path)


def attempt_region(run: Run, attempt: Attempt) -> LogRegion:
    if attempt.log_path:
        return LogRegion(attempt.log_path)
    following = [a for a in run.attempts if a.n > attempt.n and not a.log_path]
    return LogRegion(run.log_path, attempt.log_offset, following[0].log_offset if following else None)


def start_marker(attempt: Attempt, previous: Attempt | None, lang: str = "en") -> str:
    """The line `trainguard logs` shows before an attempt's output (it is not in the attempt's file:
    the job writes to a fresh, empty file)."""
    stamp = datetime.fromtimestamp(attempt.started_at).strftime("%Y-%m-%d %H:%M:%S")
    if lang == "zh":
        text = f"第 {attempt.n} 次尝试"
        if previous is not None and previous.cause:
            text += f" · 上一次终止原因：{previous.cause}"
        text += f" · 从 {attempt.resumed_from} 恢复" if attempt.resumed_from else " · 从头开始"
        if attempt.skipped:
            text += " · 跳过不完整的检查点 " + " | ".join(attempt.skipped)
    else:
        text = f"attempt {attempt.n}"
        if previous is not None and previous.cause:
            text += f" · previous attempt died: {previous.cause}"
        text += f" · resuming from {attempt.resumed_from}" if attempt.resumed_from else " · starting fresh"
        if attempt.skipped:  # incomplete ones are reported, never chosen, never deleted
            text += " · skipped incomplete " + " | ".join(attempt.skipped)
    return f"==== trainguard {stamp} · {text} ====\n"
