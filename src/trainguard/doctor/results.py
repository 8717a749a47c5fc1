"""What a doctor check returns: a CheckResult (its status and bilingual texts), and the helpers every
check builds one with. "Could not look" is ``unknown`` with the reason, never ``ok``. Fix texts live in
data/checks.toml."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cache

from trainguard._resources import load_toml
from trainguard.doctor.facts import Facts

GIB = 1024**3
MIB = 1024**2


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"


Text = dict[str, str]  # {"en": ..., "zh": ...}


def T(en: str, zh: str) -> Text:
    return {"en": en, "zh": zh}


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: Status
    summary: Text
    detail: Text
    fix: Text


@cache
def _fixes() -> dict[str, Text]:
    return {check_id: dict(texts) for check_id, texts in load_toml("checks.toml").items()}


def check_result(check_id: str, status: Status, summary: Text, detail: Text | None = None) -> CheckResult:
    fix = _fixes()[check_id] if status in (Status.WARN, Status.FAIL) else T("", "")
    return CheckResult(check_id, status, summary, detail or T("", ""), fix)


def could_not_look(check_id: str, facts: Facts, *keys: str) -> CheckResult:
    reason = next((facts.unknown[k] for k in keys if k in facts.unknown), T("not available", "无法获取"))
    if isinstance(reason, str):  # said by a library, in its own words
        reason = T(reason, f"「{reason}」")
    return check_result(check_id, Status.UNKNOWN, T(f"could not look: {reason['en']}", f"无法检查：{reason['zh']}"))


def size_text(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"
