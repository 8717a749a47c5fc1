"""How trainguard's results look: a diagnosis as one JSON object (DESIGN section 5) or a short page for
a person; a run's state and command as a person reads them."""

from __future__ import annotations

import json
import os
import shlex
from typing import TYPE_CHECKING

from trainguard import causes
from trainguard._i18n import choose_language
from trainguard._terminal import visible
from trainguard.cli import output
from trainguard.diagnosis.evidence import SILENT_END, Observation
from trainguard.postmortem import Report, report_dict

if TYPE_CHECKING:  # `trainguard diagnose` renders through this module and need not open the registry
    from collections.abc import Iterable

    from rich.table import Table

    from trainguard.store.registry import Run

_LABELS = {
    "en": {
        "confidence": "confidence",
        "evidence": "Evidence",
        "fix": "What to do",
        "also": "Also possible",
        "decide": "To decide it",
        "none": "no line in the log points to a cause",
        "scanned": "scanned {lines:,} lines ({size})",
        "first": "First failure",
        "rank": "rank",
    },
    "zh": {
        "confidence": "置信度",
        "evidence": "证据",
        "fix": "怎么办",
        "also": "其他可能",
        "decide": "如何确定原因",
        "none": "日志中没有指向原因的行",
        "scanned": "已扫描 {lines:,} 行（{size}）",
        "first": "最先失败",
        "rank": "rank",
    },
}


_SHOWN_TEXT = 200  # characters of an evidence line on a terminal; --json carries more


def diagnosis_json(report: Report, lang: str) -> str:
    return json.dumps(report_dict(report, lang), ensure_ascii=False, indent=2)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _where(obs: Observation, lang: str) -> str:
    if obs.source == "exit":
        return "退出" if lang == "zh" else "exit"
    place = obs.source if obs.file is None else obs.file
    if lang == "zh" and obs.file is None:
        place = {"log": "日志", "kernel": "内核", "telemetry": "监测"}.get(place, place)
    return f"{place}:{obs.line}" if obs.line is not None else place


def print_diagnosis(report: Report, lang: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    labels = _LABELS[lang]
    diagnosis = report.diagnosis
    cause = causes.get(diagnosis.cause)
    console = output.console()
    style = "bold yellow" if diagnosis.cause == causes.UNKNOWN else "bold red"
    console.print(f"[{style}]{escape(cause.title_in(lang))}[/]")
    meta = diagnosis.cause
    if diagnosis.cause != causes.UNKNOWN:
        meta += f" · {labels['confidence']} {diagnosis.confidence:.2f}"
    console.print(f"[dim]{meta}[/]")

    if report.first_failure:
        first = report.first_failure
        where = [f"{labels['rank']} {first['rank']}" if first.get("rank") is not None else None, first.get("host"),
                 first.get("time"), first.get("file")]  # fmt: skip
        console.print(f"{labels['first']}: " + escape(" · ".join(str(w) for w in where if w)))

    console.print(f"\n[bold]{labels['evidence']}[/]")
    if diagnosis.evidence:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="cyan", no_wrap=True)
        table.add_column(overflow="fold")
        for obs in diagnosis.evidence:
            if obs.note and (obs.source == "exit" or obs.rule == SILENT_END):
                # trainguard's own words, not a line of the log: in the reader's language
                table.add_row(_where(obs, lang), escape(obs.note.pick(lang)))
                continue
            text = visible(obs.text)
            shown = text if len(text) <= _SHOWN_TEXT else text[:_SHOWN_TEXT] + "…"
            text = escape(shown)
            if obs.note:
                text += f"\n[dim]{escape(obs.note.pick(lang))}[/]"
            table.add_row(_where(obs, lang), text)
        console.print(table)
    else:
        console.print(f"  [dim]{labels['none']}[/]")

    console.print(f"\n[bold]{labels['fix']}[/]")
    console.print(_numbered(cause.fixes_in(lang)))

    if diagnosis.alternatives:
        also = ", ".join(f"{c} ({conf:.2f})" for c, conf in diagnosis.alternatives)
        console.print(f"\n[dim]{labels['also']}: {also}[/]")
    if report.next_steps:
        console.print(f"\n[bold]{labels['decide']}[/]")
        console.print(_numbered(step.text.pick(lang) for step in report.next_steps))
    console.print(f"[dim]{labels['scanned'].format(lines=report.lines_scanned, size=_size(report.bytes_scanned))}[/]")
    console.file.flush()


def _numbered(items: Iterable[str]) -> Table:
    from rich.markup import escape
    from rich.table import Table

    table = Table.grid(padding=(0, 1))
    table.add_column(justify="right", no_wrap=True)
    table.add_column(overflow="fold")
    for number, item in enumerate(items, start=1):
        table.add_row(f"  {number}.", escape(item))
    return table


# The five public states (DESIGN section 5) as a person reads them in Chinese.
STATE_ZH = {
    "running": "运行中",
    "restarting": "等待重启",
    "succeeded": "已成功",
    "failed": "已失败",
    "stopped": "已停止",
}


def shell_join(command: list[str]) -> str:
    """A command as a person would type it again: quoted where the shell needs it, with any control
    character written out (a terminal must never act on what a record holds)."""
    return visible(shlex.join(command))


def ended_line(run: Run) -> str:
    """The state an ended run is in and why, as one line."""
    reason = run.reason_in(choose_language(None, os.environ))
    state = output.say(f"run {run.id}: {run.state}", f"运行 {run.id}：{STATE_ZH[run.state]}")
    return state + (f" ({reason})" if reason else "")
