"""`trainguard top`'s panels as rich renderables, from a ``Snapshot``: the runs (the selected one
highlighted), the GPUs with their processes, the host. Narrower terminals get fewer columns. The
same renderables serve the live view and ``top --once``. English or Chinese."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.text import Text

from trainguard import causes
from trainguard._terminal import visible
from trainguard.top import fit
from trainguard.top.model import GpuView, HostView, RunView, Snapshot
from trainguard.units import format_duration, format_size

WIDE = 110  # columns from which the GPU panel names each card and the host panel is one line
NARROW = 70  # below this, the bare minimum of the panels and of the keys' help

TEXTS: dict[str, tuple[str, str]] = {
    "runs": ("Runs", "运行"),
    "no_runs": ("no runs in {dir} yet: trainguard run -- CMD", "{dir} 中还没有运行：trainguard run -- 命令"),
    "col_run": ("RUN", "运行"),
    "col_state": ("STATE", "状态"),
    "col_attempt": ("ATT", "尝试"),
    "col_uptime": ("UP / ENDED", "运行/结束"),
    "col_step": ("STEP", "步"),
    "col_ckpt": ("CKPT AGE", "检查点"),
    "col_rss": ("RSS / LIMIT", "内存/上限"),
    "col_goodput": ("GOODPUT", "有效率"),
    "col_alert": ("LAST ALERT / DEATH", "最近告警/终止"),
    "col_alert_short": ("ALERT", "告警"),
    "ago": ("{t} ago", "{t}前"),
    "host_limit": ("host", "主机"),
    "gpus": ("GPUs", "GPU"),
    "no_gpu": (
        "no NVIDIA GPU visible (no driver, or NVML cannot be loaded)",
        "看不到 NVIDIA GPU（没有驱动，或无法加载 NVML）",
    ),
    "throttle": ("throttled", "降频"),
    "no_processes": ("no processes", "无进程"),
    "not_ours": ("not a trainguard run", "不属于 trainguard 运行"),
    "host": ("Host", "主机"),
    "ram": ("RAM", "内存"),
    "swap": ("swap", "交换"),
    "disk": ("disk", "磁盘"),
    "free": ("free", "可用"),
    "used": ("used", "已用"),
    "state_dir": ("state", "状态目录"),
    "keys": (
        "↑↓ select · enter/l log · d diagnosis · s stop · q quit",
        "↑↓ 选择 · enter/l 日志 · d 诊断 · s 停止 · q 退出",
    ),
    "keys_short": ("↑↓ l d s q", "↑↓ l d s q"),
    "state_running": ("running", "运行中"),
    "state_restarting": ("restarting", "重启中"),
    "state_succeeded": ("succeeded", "成功"),
    "state_failed": ("failed", "失败"),
    "state_stopped": ("stopped", "已停止"),
    "diagnosis_none": (
        "No attempt of run {run} has died: nothing to diagnose.",
        "运行 {run} 没有异常终止的尝试：无需诊断。",
    ),
    "diagnosis_title": ("Attempt {n}: {title}", "第 {n} 次尝试：{title}"),
    "confidence": ("confidence", "置信度"),
    "evidence": ("Evidence", "证据"),
    "what_to_do": ("What to do", "处理办法"),
    "also": ("Also possible", "其他可能"),
    "log_title": (
        "log of run {run}, attempt {n}: {path} (the last {lines} lines; esc closes)",
        "运行 {run} 第 {n} 次尝试的日志：{path}（最后 {lines} 行；esc 关闭）",
    ),
    "log_empty": ("(the log is empty or gone)", "（日志为空或已不存在）"),
    "confirm_stop": (
        "Stop run {run}?\nIt gets its stop signal, {grace} for a last checkpoint, then SIGKILL "
        "(as `trainguard stop {run}`).\n\n[y] stop it    [n] / esc keep it running",
        "停止运行 {run}？\n先发送停止信号，留 {grace} 保存最后的检查点，然后 SIGKILL"
        "（与 `trainguard stop {run}` 相同）。\n\n[y] 停止    [n] / esc 继续运行",
    ),
    "not_active": ("run {run} is not running ({state}): nothing to stop", "运行 {run} 没有在运行（{state}）：无需停止"),
    "stopping": ("stopping run {run}…", "正在停止运行 {run}…"),
}


def t(key: str, lang: str, **values: Any) -> str:
    en, zh = TEXTS[key]
    return (zh if lang == "zh" else en).format(**values)


def _bar(fraction: float | None, width: int = 10) -> Text:
    """A small gauge, coloured by how full it is."""
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    style = "red" if fraction >= 0.9 else ("yellow" if fraction >= 0.75 else "green")
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


STATE_STYLE = {"running": "green", "restarting": "yellow", "succeeded": "cyan", "failed": "bold red",
               "stopped": "dim"}  # fmt: skip


# The runs table's layouts, from the richest to the leanest: the first that fits the terminal is shown.
# What goes first: goodput, the step rate, the uptime (the RSS narrows to its gauge and size), the
# attempt number, the RSS, the checkpoint age, the step. A run's name (at least NAME_FLOOR cells,
# then cut with an ellipsis), its state and its alert (under a shorter heading) stay to the end.
RUN_LAYOUTS = (
    ("run", "state", "attempt", "since", "step_rate", "ckpt", "rss", "goodput", "alert"),
    ("run", "state", "attempt", "since", "step_rate", "ckpt", "rss", "alert"),
    ("run", "state", "attempt", "since", "step", "ckpt", "rss", "alert_short"),
    ("run", "state", "attempt", "step", "ckpt", "rss_short", "alert_short"),
    ("run", "state", "step", "ckpt", "rss_short", "alert_short"),
    ("run", "state", "step", "ckpt", "alert_short"),
    ("run", "state", "step", "alert_short"),
    ("run", "state", "alert_short"),
)
NAME_FLOOR = 16
ALERT_FLOOR = 12


def runs_table(snapshot: Snapshot, selected: int, width: int, lang: str, max_rows: int | None = None) -> Any:
    if not snapshot.runs:
        return Text(t("no_runs", lang, dir=visible(snapshot.state_dir)), style="dim")
    columns = _run_columns(snapshot.runs, lang)  # measured over every run: the layout holds while scrolling
    chosen = [columns[key] for key in fit.choose(RUN_LAYOUTS, columns, width)]
    table = fit.fitted_table(chosen, width)
    rows = list(range(len(snapshot.runs)))
    if max_rows is not None and len(rows) > max_rows:  # a window that keeps the selected run in view
        first = min(max(0, selected - max_rows // 2), len(rows) - max_rows)
        rows = rows[first : first + max_rows]
    for index in rows:
        table.add_row(*(column.cells[index] for column in chosen), style="reverse" if index == selected else None)
    return table


def _run_columns(runs: Sequence[RunView], lang: str) -> dict[str, fit.Column]:
    """Every column the runs table may show, by key, each with one cell per run."""
    alerts = [_alert_cell(run, lang) for run in runs]
    return {
        "run": fit.Column(t("col_run", lang), [Text(visible(_label(run))) for run in runs], floor=NAME_FLOOR, share=2),
        "state": fit.Column(t("col_state", lang), [Text(t(f"state_{run.state}", lang),
                                                        style=STATE_STYLE.get(run.state, "")) for run in runs]),
        "attempt": fit.Column(t("col_attempt", lang), [Text(str(run.attempt or "-")) for run in runs], "right"),
        "since": fit.Column(t("col_uptime", lang), [Text(_age(run.since_s) if run.active
                                                         else t("ago", lang, t=_age(run.since_s))) for run in runs],
                            "right"),
        "step_rate": fit.Column(t("col_step", lang), [_step_cell(run, with_rate=True) for run in runs], "right"),
        "step": fit.Column(t("col_step", lang), [_step_cell(run, with_rate=False) for run in runs], "right"),
        "ckpt": fit.Column(t("col_ckpt", lang), [Text(_age(run.checkpoint_age_s)) for run in runs], "right"),
        "rss": fit.Column(t("col_rss", lang), [_rss_cell(run, lang, compact=False) for run in runs]),
        "rss_short": fit.Column(t("col_rss", lang), [_rss_cell(run, lang, compact=True) for run in runs]),
        "goodput": fit.Column(t("col_goodput", lang), [Text("-" if run.goodput is None else f"{100 * run.goodput:.0f}%")
                                                       for run in runs], "right"),
        "alert": fit.Column(t("col_alert", lang), alerts, floor=Text(t("col_alert", lang)).cell_len, share=3),
        "alert_short": fit.Column(t("col_alert_short", lang), alerts, floor=ALERT_FLOOR, share=3),
    }  # fmt: skip


def _label(run: RunView) -> str:
    return f"{run.name} ({run.id})" if run.name else run.id


def _step_cell(run: RunView, *, with_rate: bool) -> Text:
    if run.step is None:
        return Text("-")
    step = f"{run.step}" + ("" if run.step_from == "job" else "◆")
    if run.steps_per_s and with_rate:
        step += f" {run.steps_per_s:.2g}/s"
    return Text(step)


def _rss_cell(run: RunView, lang: str, *, compact: bool) -> Text:
    """The job's RSS against its limit: a gauge and both sizes, or (``compact``) a small gauge and the RSS."""
    if run.rss is None:
        return Text("-")
    if not run.limit:
        return Text(format_size(run.rss))
    if compact:
        return _bar(run.rss / run.limit, 4) + Text(f" {format_size(run.rss)}")
    limit = format_size(run.limit) + ("" if run.limit_is_own else f" {t('host_limit', lang)}")
    return _bar(run.rss / run.limit, 6) + Text(f" {format_size(run.rss)}/{limit}")


def _alert_cell(run: RunView, lang: str) -> Text:
    if run.alert:
        return Text(f"{visible(run.alert)} ({t('ago', lang, t=_age(run.alert_age_s))})", style="yellow")
    if run.last_cause:
        return Text(visible(run.last_cause), style="red")
    return Text("")


def gpu_panel(snapshot: Snapshot, width: int, lang: str, max_processes: int = 4) -> Any:
    if not snapshot.gpus:
        return Text(t("no_gpu", lang), style="dim")
    lines: list[Any] = []
    for gpu in snapshot.gpus:
        lines.append(_gpu_line(gpu, width, lang))
        shown = gpu.processes[:max_processes] if width >= NARROW else gpu.processes[:1]
        for proc in shown:
            owner = f"{proc.run_name} ({proc.run_id})" if proc.run_name else (proc.run_id or t("not_ours", lang))
            used = format_size(proc.used) if proc.used is not None else "?"
            lines.append(Text(visible(f"    pid {proc.pid} {proc.command or ''}  {used}  → {owner}"),
                              style="" if proc.run_id else "dim"))  # fmt: skip
        if len(gpu.processes) > len(shown):
            lines.append(Text(f"    … +{len(gpu.processes) - len(shown)}", style="dim"))
    return Group(*lines)


def _gpu_line(gpu: GpuView, width: int, lang: str) -> Text:
    fraction = gpu.memory_used / gpu.memory_total if gpu.memory_total else None
    text = Text(f"GPU {gpu.index} ", style="bold")
    if gpu.name and width >= WIDE:
        text += Text(f"{visible(gpu.name)}  ", style="dim")
    text += _bar(fraction, 8 if width >= NARROW else 5)
    text += Text(f" {format_size(gpu.memory_used)}/{format_size(gpu.memory_total)}")
    if gpu.utilization is not None:
        text += Text(f"  {gpu.utilization}%")
    if gpu.temperature_c is not None:
        text += Text(f"  {gpu.temperature_c}°C", style="red" if gpu.temperature_c >= 85 else "")
    if gpu.power_w is not None and width >= NARROW:
        limit = f"/{gpu.power_limit_w:.0f}" if gpu.power_limit_w else ""
        text += Text(f"  {gpu.power_w:.0f}{limit} W")
    if gpu.throttle:
        text += Text(f"  {t('throttle', lang)}: {','.join(gpu.throttle)}", style="yellow")
    return text


def host_panel(host: HostView, width: int, lang: str) -> Any:
    parts: list[Text] = []

    def gauge(label: str, used: int | None, total: int | None) -> None:
        if used is None or not total:
            return
        parts.append(Text(f"{label} ") + _bar(used / total, 8 if width >= NARROW else 4)
                     + Text(f" {format_size(used)}/{format_size(total)}"))  # fmt: skip

    if host.mem_total is not None and host.mem_available is not None:
        gauge(t("ram", lang), host.mem_total - host.mem_available, host.mem_total)
    gauge(t("swap", lang), host.swap_used, host.swap_total)
    gauge("/dev/shm", host.shm_used, host.shm_total)
    for disk in host.disks:
        label = t("state_dir", lang) if disk.label == "state" else visible(disk.label)
        parts.append(Text(f"{t('disk', lang)} {label}: {format_size(disk.free)} {t('free', lang)} / "
                          f"{format_size(disk.total)}", style="red" if disk.free < 2**30 else ""))  # fmt: skip
    separator = Text("   ")
    if width >= WIDE:
        return Text("").join([*[p + separator for p in parts[:-1]], *parts[-1:]]) if parts else Text("")
    return Group(*parts)


def diagnosis_view(run: Any, lang: str) -> Any:
    """The newest death of ``run``: cause, evidence and fixes, as `trainguard diagnose` shows them. Every
    recorded text is shown with its control characters visible: the evidence is quoted from the log."""
    died = [a for a in run.attempts if a.diagnosis]
    if not died:
        return Text(t("diagnosis_none", lang, run=visible(run.name or run.id)))
    attempt = died[-1]
    d: Mapping[str, Any] = attempt.diagnosis
    title, fixes = d.get("title", d["cause"]), list(d.get("fixes", []))
    if lang != "en" and d["cause"] in causes.catalogue():  # recorded in English: the catalogue has both
        title, fixes = causes.get(d["cause"]).title_in(lang), list(causes.get(d["cause"]).fixes_in(lang))
    lines: list[Any] = [
        Text(visible(t("diagnosis_title", lang, n=attempt.n, title=title)), style="bold red"),
        Text(visible(f"{d['cause']} · {t('confidence', lang)} {d.get('confidence', 0):.2f}"), style="dim"),
        Text(""),
        Text(t("evidence", lang), style="bold"),
    ]
    for ev in d.get("evidence", []):
        where = f"{ev.get('source', '')}:{ev['line']}" if ev.get("line") else ev.get("source", "")
        lines.append(Text(f"  {visible(str(where))}  ", style="cyan") + Text(visible(str(ev.get("text", "")))))
    lines += [Text(""), Text(t("what_to_do", lang), style="bold")]
    lines += [Text(f"  {i}. {visible(str(fix))}") for i, fix in enumerate(fixes, start=1)]
    alternatives: Sequence[Mapping[str, Any]] = d.get("alternatives", [])
    if alternatives:
        listed = ", ".join(f"{a['cause']} ({a['confidence']:.2f})" for a in alternatives)
        lines += [Text(""), Text(visible(f"{t('also', lang)}: {listed}"), style="dim")]
    return Group(*lines)


def whole_view(snapshot: Snapshot, width: int, lang: str, selected: int = 0) -> Any:
    """Everything at once (``top --once``)."""
    title = Text(visible(f"trainguard top · {snapshot.hostname}"), style="bold")
    return Group(title, Text(""), Text(t("runs", lang), style="bold underline"),
                 runs_table(snapshot, selected, width, lang), Text(""),
                 Text(t("gpus", lang), style="bold underline"), gpu_panel(snapshot, width, lang), Text(""),
                 Text(t("host", lang), style="bold underline"), host_panel(snapshot.host, width, lang))  # fmt: skip
