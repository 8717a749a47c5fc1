"""``trainguard report``: one self-contained HTML page per run. A timeline whose rows each sit on their
own scale — training progress with every checkpoint the supervisor recorded (pruned ones too), the
job's memory against its limit, host RAM, GPU memory against the card, utilisation, temperature,
/dev/shm, free disk — with each attempt shaded and labelled with its cause of death; what the deaths
cost (goodput); the diagnosis of each death with its evidence and fixes; the alerts. Charts by
plotly, its JavaScript inlined so the page opens without a network. English or Chinese. A pure
function of the run's records. Every recorded text (names, commands, lines quoted from a log) is
escaped, with its control characters made visible (a bidi override would reorder what follows)."""

from __future__ import annotations

import html
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from trainguard import causes
from trainguard import goodput as goodput_module
from trainguard._terminal import visible
from trainguard.store.states import PUBLIC_STATE, RunState
from trainguard.units import format_duration, format_size

GIB = 1024**3

# Every text a person reads on the page: (English, Chinese).
TEXTS: dict[str, tuple[str, str]] = {
    "title": ("trainguard · run", "trainguard · 运行"),
    "command": ("command", "命令"),
    "host": ("host", "主机"),
    "state": ("state", "状态"),
    "started": ("started", "开始"),
    "log": ("log", "日志"),
    "gpus": ("GPUs", "GPU"),
    "gpus_sampled": ("sampled", "已采样"),
    "gpus_none": ("none sampled (no NVIDIA GPU visible)", "未采样（看不到 NVIDIA GPU）"),
    "memory_limit": ("memory limit", "内存上限"),
    "no_memory_limit": ("none (--memory-limit not given)", "无（未指定 --memory-limit）"),
    "timeline": ("Timeline", "时间线"),
    "goodput": ("Goodput: what the failures cost", "有效训练率（goodput）：故障的代价"),
    "attempts": ("Attempts", "尝试"),
    "deaths": ("Deaths", "终止"),
    "alerts": ("Alerts", "告警"),
    "none": ("none", "无"),
    "no_death": ("No attempt died.", "没有尝试异常终止。"),
    "evidence": ("Evidence", "证据"),
    "what_to_do": ("What to do", "处理办法"),
    "confidence": ("confidence", "置信度"),
    "attempt": ("attempt", "尝试"),
    "col_n": ("#", "#"),
    "col_started": ("started", "开始"),
    "col_ended": ("ended", "结束"),
    "col_how": ("how", "方式"),
    "col_cause": ("cause", "原因"),
    "col_resumed": ("resumed from", "恢复自"),
    "col_steps": ("steps", "步数"),
    "running": ("running", "运行中"),
    "state_running": ("running", "运行中"),
    "state_restarting": ("restarting", "重启中"),
    "state_succeeded": ("succeeded", "成功"),
    "state_failed": ("failed", "失败"),
    "state_stopped": ("stopped", "已停止"),
    "succeeded": ("finished", "完成"),
    "stopped": ("stopped on request", "按请求停止"),
    "exit": ("exit", "退出码"),
    "signal": ("signal", "信号"),
    "step": ("step", "步"),
    "headline": (
        "of the wall time was training that was kept: {kept} of {wall}",
        "的墙钟时间是保留下来的训练：{wall} 中的 {kept}",
    ),
    "lost_line": (
        "Lost: {recomputed} recomputing steps, {never_saved} never saved, {restart} restarting, "
        "{stalled} stalled before deaths",
        "损失：重算 {recomputed}，未保存 {never_saved}，重启 {restart}，终止前停滞 {stalled}",
    ),
    "row_progress": ("Training progress (step) · ◆ checkpoint", "训练进度（步）· ◆ 检查点"),
    "row_checkpoints": ("Checkpoints (the job reports no steps)", "检查点（作业未报告步数）"),
    "row_rss_limit": ("Job memory (RSS, GiB) against its limit of {limit}", "作业内存（RSS，GiB）与上限 {limit}"),
    "row_rss_host": (
        "Job memory (RSS, GiB) · no limit; host RAM {total}",
        "作业内存（RSS，GiB）· 无上限；主机内存 {total}",
    ),
    "row_host": ("Host RAM available (GiB) of {total}", "主机可用内存（GiB），共 {total}"),
    "row_gpu_memory": ("GPU memory used (GiB) against the card", "GPU 显存占用（GiB）与显存容量"),
    "row_gpu_util": ("GPU utilisation (%)", "GPU 利用率（%）"),
    "row_gpu_temp": ("GPU temperature (°C)", "GPU 温度（°C）"),
    "row_shm": ("/dev/shm used (%) of {total}", "/dev/shm 已用（%），共 {total}"),
    "row_disk": ("Free disk (GiB)", "磁盘剩余空间（GiB）"),
    "no_samples": ("No samples were recorded", "没有记录到采样"),
    "job_rss": ("job RSS", "作业 RSS"),
    "limit": ("limit", "上限"),
    "ram_available": ("RAM available", "可用内存"),
    "swap_used": ("swap used", "已用交换空间"),
    "card": ("card", "显存容量"),
    "run_folder": ("run folder", "运行目录"),
    "checkpoint_folder": ("checkpoints", "检查点目录"),
    "checkpoint": ("checkpoint", "检查点"),
    "alert": ("alert", "告警"),
    "kept": ("training kept", "保留的训练"),
    "recomputed": ("recomputed (steps redone)", "重算（重做的步）"),
    "unsaved": ("trained, not in a checkpoint yet", "已训练、尚未存入检查点"),
    "never_saved": ("never saved", "未保存"),
    "lost_never_saved": ("never saved (the run ended unfinished)", "未保存（运行未完成就结束）"),
    "restart": ("restarting", "重启"),
    "stalled": ("stalled before a death", "终止前停滞"),
    "overhead": ("start-up and shut-down", "启动与退出"),
    "wall": ("wall time", "墙钟时间"),
    "paused": ("paused between a stop and the continuation (not counted)", "停止后到继续前的暂停（不计入）"),
    "loss_cause": ("death", "终止"),
    "loss_recomputed": ("recomputed", "重算"),
    "loss_restart": ("restarting", "重启"),
    "loss_stalled": ("stalled", "停滞"),
    "measured_by": ("measured by", "依据"),
    "by_steps": ("reported steps", "报告的步数"),
    "by_checkpoints": ("checkpoint times", "检查点时间"),
    "by_mixed": ("reported steps and checkpoint times", "报告的步数与检查点时间"),
    "by_unknown": ("unknown: resumed from a checkpoint of unknown step and time", "未知：恢复自步数与时间不明的检查点"),
}


def _t(key: str, lang: str, **values: str) -> str:
    en, zh = TEXTS[key]
    return (zh if lang == "zh" else en).format(**values)


def _escape(text: object) -> str:
    return html.escape(visible(str(text)))


@dataclass(frozen=True)
class Marker:
    time: float
    label: str
    kind: str  # "checkpoint" | "alert"
    step: int | None = None
    path: str | None = None


@dataclass
class _Row:
    title: str
    series: list[tuple[str, list[float | None], dict[str, Any]]] = field(default_factory=list)
    y_range: tuple[float, float] | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)  # horizontal reference lines (value, label)
    hover: str = "%{y:.2f}"


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "…"
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _dt(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, timezone.utc)


def _max(values: Iterable[float | None]) -> float:
    return max((v for v in values if v is not None), default=0.0)


def checkpoint_markers(events: Iterable[Mapping[str, Any]], extra: Iterable[Marker] = ()) -> list[Marker]:
    """Every checkpoint the supervisor recorded, and those in ``extra`` (found in the folder) it did
    not: one marker per (path, time)."""
    found: dict[tuple[str | None, int], Marker] = {}
    for e in events:
        if e.get("kind") == "checkpoint":
            step = e.get("step") if isinstance(e.get("step"), int) else None
            marker = Marker(float(e["time"]), f"checkpoint step {step}" if step is not None else "checkpoint", "checkpoint",
                            step, e.get("path"))  # fmt: skip
            found[(marker.path, round(marker.time))] = marker
    for marker in extra:
        found.setdefault((marker.path, round(marker.time)), marker)
    return sorted(found.values(), key=lambda m: m.time)


def _resource_rows(samples: list[dict[str, Any]], run: Any, lang: str) -> list[_Row]:
    def gpu(index: int, key: str, scale: float = 1.0) -> list[float | None]:
        values = []
        for s in samples:
            found = next((g for g in s.get("gpus", []) if g["index"] == index), None)
            values.append(found[key] / scale if found and found.get(key) is not None else None)
        return values

    def host(key: str, scale: float = GIB) -> list[float | None]:
        return [s[key] / scale if s.get(key) is not None else None for s in samples]

    rows: list[_Row] = []
    rss = host("job_rss")
    limit = run.options.get("memory_limit")
    host_total = _max(s.get("mem_total") for s in samples)
    if any(v is not None for v in rss):
        if limit:
            rows.append(_Row(_t("row_rss_limit", lang, limit=format_size(limit)), [(_t("job_rss", lang), rss, {})],
                             (0.0, limit / GIB * 1.08), [(limit / GIB, f"{_t('limit', lang)} {format_size(limit)}")],
                             "%{y:.2f} GiB"))  # fmt: skip
        else:
            top = max(_max(rss) * 1.3, 0.05)
            rows.append(_Row(_t("row_rss_host", lang, total=format_size(host_total) if host_total else "?"),
                             [(_t("job_rss", lang), rss, {})], (0.0, top), [], "%{y:.2f} GiB"))  # fmt: skip
    available = host("mem_available")
    if any(v is not None for v in available):
        swap = host("swap_used")
        series = [(_t("ram_available", lang), available, {})]
        if any(v for v in swap):
            series.append((_t("swap_used", lang), swap, {"line": {"dash": "dot"}}))
        total = host_total / GIB if host_total else _max(available) * 1.1
        rows.append(_Row(_t("row_host", lang, total=format_size(host_total) if host_total else "?"), series,
                         (0.0, total * 1.05), [(total, format_size(host_total))] if host_total else [],
                         "%{y:.2f} GiB"))  # fmt: skip
    gpus = sorted({g["index"] for s in samples for g in s.get("gpus", [])})
    if gpus:
        cards = {i: _max(gpu(i, "memory_total", GIB)) for i in gpus}
        rows.append(_Row(_t("row_gpu_memory", lang), [(f"GPU {i}", gpu(i, "memory_used", GIB), {}) for i in gpus],
                         (0.0, max(cards.values()) * 1.05),
                         [(total, f"GPU {i} {_t('card', lang)} {total:.0f} GiB") for i, total in cards.items()],
                         "%{y:.2f} GiB"))  # fmt: skip
        utilisation = [(f"GPU {i}", gpu(i, "utilization"), {}) for i in gpus]
        if any(v is not None for _, values, _ in utilisation for v in values):
            rows.append(_Row(_t("row_gpu_util", lang), utilisation, (0.0, 105.0), [], "%{y:.0f}%"))
        temperature = [(f"GPU {i}", gpu(i, "temperature_c"), {}) for i in gpus]
        if any(v is not None for _, values, _ in temperature for v in values):
            hottest = _max(v for _, values, _ in temperature for v in values)
            rows.append(_Row(_t("row_gpu_temp", lang), temperature, (20.0, max(100.0, hottest + 5)), [(85.0, "85 °C")],
                             "%{y:.0f} °C"))  # fmt: skip
    shm_total = _max(s.get("shm_total") for s in samples)
    if shm_total:
        used = [100 * s["shm_used"] / s["shm_total"] if s.get("shm_total") and s.get("shm_used") is not None else None
                for s in samples]  # fmt: skip
        rows.append(_Row(_t("row_shm", lang, total=format_size(shm_total)), [("/dev/shm", used, {})], (0.0, 105.0), [],
                         "%{y:.1f}%"))  # fmt: skip
    paths = sorted({p for s in samples for p in s.get("disk_free", {})})
    if paths:
        names = {run.run_dir: _t("run_folder", lang), run.options.get("checkpoint_dir"): _t("checkpoint_folder", lang)}
        series = []
        for path in paths:
            label = visible(f"{names[path]} ({path})" if path in names else path)
            series.append((label, [s["disk_free"][path] / GIB if path in s.get("disk_free", {}) else None
                                   for s in samples], {}))  # fmt: skip
        top = _max(v for _, values, _ in series for v in values)
        rows.append(_Row(_t("row_disk", lang), series, (0.0, max(top * 1.15, 1.0)), [], "%{y:.2f} GiB"))
    return rows


def _progress_points(attempt: Any, checkpoints: Sequence[Marker], end: float) -> list[tuple[float, int]]:
    """(time, step) of one attempt: its first reported step, the checkpoints saved meanwhile, its last."""
    reported = attempt.progress or {}
    points = []
    if isinstance(reported.get("first_step_time"), (int, float)) and isinstance(reported.get("first_step"), int):
        points.append((reported["first_step_time"], reported["first_step"]))
    points += [(m.time, m.step) for m in checkpoints if m.step is not None and attempt.started_at <= m.time <= end]
    if isinstance(reported.get("step_time"), (int, float)) and isinstance(reported.get("step"), int):
        points.append((reported["step_time"], reported["step"]))
    return sorted(set(points))


def timeline_figure(run: Any, samples: list[dict[str, Any]], checkpoints: Sequence[Marker],
                    alerts: Sequence[Marker], *, lang: str = "en", now: float) -> Any:  # fmt: skip
    from plotly.subplots import make_subplots

    with_steps = any(m.step is not None for m in checkpoints) or any(
        (a.progress or {}).get("step") is not None for a in run.attempts
    )
    progress_title = _t("row_progress" if with_steps else "row_checkpoints", lang)
    rows = [_Row(progress_title), *_resource_rows(samples, run, lang)]
    if not samples:
        rows.append(_Row(_t("no_samples", lang)))
    heights = [1.3] + [1.0] * (len(rows) - 1)
    figure = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.045,
                           subplot_titles=[row.title for row in rows], row_heights=heights)  # fmt: skip
    times = [_dt(s["time"]) for s in samples]
    palette = ["#268bd2", "#d33682", "#2aa198", "#b58900", "#6c71c4", "#cb4b16", "#859900", "#dc322f"]
    for number, row in enumerate(rows[1:], start=2):
        for k, (name, values, style) in enumerate(row.series):
            figure.add_scatter(x=times, y=values, name=name, mode="lines", row=number, col=1, legendgroup=str(number),
                               line={"color": palette[k % len(palette)], **style.get("line", {})},
                               hovertemplate=f"{name}: {row.hover}<extra></extra>")  # fmt: skip
        for value, label in row.lines:
            figure.add_hline(y=value, line_dash="dash", line_color="#dc322f", line_width=1.5, row=number, col=1,
                             annotation_text=label, annotation_position="top left",
                             annotation_font={"size": 11, "color": "#dc322f"})  # fmt: skip
        if row.y_range is not None:
            figure.update_yaxes(range=list(row.y_range), row=number, col=1)
    # Row 1: each attempt's steps through time, every recorded checkpoint, the alerts.
    top_step = 1.0
    for k, attempt in enumerate(run.attempts):
        end = attempt.ended_at if attempt.ended_at is not None else now
        points = _progress_points(attempt, checkpoints, end)
        if points:
            top_step = max(top_step, *(s for _, s in points))
            label = f"{_t('attempt', lang)} {attempt.n}"
            figure.add_scatter(x=[_dt(t) for t, _ in points], y=[s for _, s in points], mode="lines", name=label,
                               line={"color": palette[k % len(palette)], "width": 2}, row=1, col=1, showlegend=False,
                               hovertemplate=f"{label}: {_t('step', lang)} %{{y}}<extra></extra>")  # fmt: skip
    if checkpoints:
        ys = [m.step if m.step is not None else (0 if with_steps else 1) for m in checkpoints]
        texts = [visible(f"{_t('checkpoint', lang)} {_t('step', lang)} {m.step} · {m.path or ''}" if m.step is not None
                         else f"{_t('checkpoint', lang)} · {m.path or ''}") for m in checkpoints]  # fmt: skip
        figure.add_scatter(x=[_dt(m.time) for m in checkpoints], y=ys, mode="markers", name=_t("checkpoint", lang),
                           marker={"symbol": "diamond", "size": 9, "color": "#073642"}, hovertext=texts,
                           hoverinfo="text", row=1, col=1, showlegend=False)  # fmt: skip
    if alerts:
        figure.add_scatter(x=[_dt(m.time) for m in alerts], y=[top_step * 1.08] * len(alerts), mode="markers",
                           name=_t("alert", lang), marker={"symbol": "x", "size": 10, "color": "#cb4b16"},
                           hovertext=[m.label for m in alerts], hoverinfo="text", row=1, col=1,
                           showlegend=False)  # fmt: skip
    figure.update_yaxes(range=[0, top_step * 1.15] if with_steps else [0, 2], showticklabels=with_steps, row=1, col=1)
    # Attempts: shaded through every row, labelled once at the top with how each ended.
    for attempt in run.attempts:
        end = attempt.ended_at if attempt.ended_at is not None else now
        if attempt.cause:
            color, text, line = "rgba(220,50,47,0.10)", f"#{attempt.n} {attempt.cause}", "#dc322f"
        elif attempt.ended_at is None:
            color, text, line = "rgba(38,139,210,0.08)", f"#{attempt.n} {_t('running', lang)}", None
        elif run.state == "stopped" and attempt is run.attempts[-1]:
            color, text, line = "rgba(147,161,161,0.12)", f"#{attempt.n} {_t('stopped', lang)}", "#93a1a1"
        else:
            color, text, line = "rgba(133,153,0,0.08)", f"#{attempt.n} {_t('succeeded', lang)}", "#859900"
        figure.add_vrect(x0=_dt(attempt.started_at), x1=_dt(end), fillcolor=color, line_width=0, row="all", col=1)
        if line is not None:
            figure.add_vline(x=_dt(end).timestamp() * 1000, line_color=line, line_dash="dot", line_width=1.5)
        figure.add_annotation(x=_dt(attempt.started_at + (end - attempt.started_at) / 2), y=0.98, xref="x",
                              yref="y domain", yanchor="top", text=f"<b>{_escape(text)}</b>", showarrow=False,
                              font={"size": 12, "color": line or "#268bd2"}, bgcolor="rgba(255,255,255,0.7)")  # fmt: skip
    figure.update_layout(height=170 + 200 * len(rows), margin={"l": 60, "r": 30, "t": 70, "b": 40},
                         template="plotly_white", hovermode="x unified",
                         legend={"orientation": "h", "y": -0.02, "yanchor": "top"})  # fmt: skip
    figure.update_xaxes(showticklabels=True, tickformat="%H:%M:%S")
    figure.update_xaxes(tickformat=None, row=len(rows), col=1)  # the last row also says the date
    return figure


def _goodput_section(result: goodput_module.Goodput, lang: str) -> str:
    e = _escape
    if result.ratio is None:
        return f"<p>{e(goodput_module.describe(result, lang))}</p>"
    redone = result.recomputed_s - result.never_saved_s
    parts = [("kept", result.kept_s, "#859900"), ("recomputed", redone, "#dc322f"),
             ("lost_never_saved", result.never_saved_s, "#d33682"), ("unsaved", result.unsaved_s, "#b58900"),
             ("restart", result.restart_s, "#cb4b16"), ("stalled", result.stalled_s, "#6c71c4"),
             ("overhead", result.overhead_s, "#93a1a1")]  # fmt: skip
    bar = "".join(
        f"<div class='part' style='flex:{seconds:.6f};background:{color}' title='{e(_t(key, lang))}: "
        f"{e(format_duration(seconds))}'></div>"
        for key, seconds, color in parts
        if seconds > 0
    )
    legend = "".join(
        f"<li><span class='swatch' style='background:{color}'></span>{e(_t(key, lang))}: "
        f"<b>{e(format_duration(seconds))}</b> ({100 * seconds / result.wall_s:.1f}%)</li>"
        for key, seconds, color in parts
        if seconds > 0
    )
    losses = "".join(
        f"<tr><td>{loss.attempt}</td><td>{e(loss.cause or _t('stopped', lang))}</td>"
        f"<td>{e(format_duration(loss.recomputed_s))}"
        f"{'' if loss.redone else ' ' + e(_t('never_saved', lang))}"
        f"{f' ({goodput_module.steps_text(loss.recomputed_steps, lang)})' if loss.recomputed_steps else ''}</td>"
        f"<td>{e(format_duration(loss.restart_s))}</td><td>{e(format_duration(loss.stalled_s))}</td>"
        f"<td>{e(_t('by_' + loss.measured_by, lang))}</td></tr>"
        for loss in result.losses
    )
    table = (
        f"<table class='losses'><tr><th>{_t('attempt', lang)}</th><th>{_t('loss_cause', lang)}</th>"
        f"<th>{_t('loss_recomputed', lang)}</th><th>{_t('loss_restart', lang)}</th><th>{_t('loss_stalled', lang)}</th>"
        f"<th>{_t('measured_by', lang)}</th></tr>{losses}</table>"
        if losses
        else ""
    )
    paused = (f"<p><small>{e(_t('paused', lang))}: {e(format_duration(result.paused_s))}</small></p>"
              if result.paused_s > 0 else "")  # fmt: skip
    headline = _t("headline", lang, kept=format_duration(result.kept_s), wall=format_duration(result.wall_s))
    lost = _t("lost_line", lang, recomputed=format_duration(redone),
              never_saved=format_duration(result.never_saved_s),
              restart=format_duration(result.restart_s), stalled=format_duration(result.stalled_s))  # fmt: skip
    return (f"<p class='goodput'><b>{100 * result.ratio:.0f}%</b> {e(headline)}</p><p>{e(lost)}</p>"
            f"<div class='bar'>{bar}</div><ul class='legend'>{legend}</ul>"
            f"<p><small>{e(_t('measured_by', lang))}: {e(_t('by_' + result.measured_by, lang))}</small></p>"
            f"{table}{paused}")  # fmt: skip


def render(run: Any, samples: list[dict[str, Any]], events: Sequence[Mapping[str, Any]], *, lang: str = "en",
           now: float, extra_checkpoints: Iterable[Marker] = ()) -> str:  # fmt: skip
    """The page. ``events``: the run's recorded events (checkpoints, alerts); ``extra_checkpoints``:
    checkpoints found in its folder that no event recorded (runs from before they were recorded)."""
    checkpoints = checkpoint_markers(events, extra_checkpoints)
    message_key = "message_zh" if lang == "zh" else "message"
    alerts = [Marker(float(e["time"]), visible(str(e.get(message_key) or e.get("message") or e.get("rule", "alert"))),
                     "alert") for e in events if e.get("kind") == "alert"]  # fmt: skip
    result = goodput_module.compute(
        goodput_module.attempt_records(run.attempts, run_state=run.state),
        [goodput_module.CheckpointMark(m.time, m.step, m.path) for m in checkpoints],
        now=now,
        run_active=run.state in ("starting", "running", "backoff", "stopping"),
    )
    figure = timeline_figure(run, samples, checkpoints, alerts, lang=lang, now=now)
    chart = figure.to_html(full_html=False, include_plotlyjs="inline", config={"displaylogo": False})
    e = _escape
    rows = []
    for a in run.attempts:
        if a.exit_code is not None:
            end = f"{_t('exit', lang)} {a.exit_code}"
        elif a.signal:
            end = f"{_t('signal', lang)} {a.signal}"
        else:
            end = _t("running", lang) if a.ended_at is None else "—"
        cause = f"{a.cause} ({a.confidence:.2f})" if a.cause else "—"
        reported = a.progress or {}
        steps = ""
        if reported.get("step") is not None:
            steps = f"{reported.get('first_step', '?')} → {reported['step']}"
        rows.append(f"<tr><td>{a.n}</td><td>{e(_when(a.started_at))}</td><td>{e(_when(a.ended_at))}</td>"
                    f"<td>{e(end)}</td><td>{e(cause)}</td><td>{e(steps)}</td>"
                    f"<td><code>{e(a.resumed_from or '')}</code></td></tr>")  # fmt: skip
    deaths = []
    for a in run.attempts:
        if not a.diagnosis:
            continue
        d = a.diagnosis
        title, fixes_text = d["title"], d["fixes"]
        if lang != "en" and d["cause"] in causes.catalogue():  # recorded in English: the catalogue has both
            title, fixes_text = causes.get(d["cause"]).title_in(lang), causes.get(d["cause"]).fixes_in(lang)
        evidence = "".join(
            f"<li><code>{e(ev['source'])}{':' + str(ev['line']) if ev.get('line') else ''}</code> {e(ev['text'])}</li>"
            for ev in d["evidence"]
        )
        fixes = "".join(f"<li>{e(fix)}</li>" for fix in fixes_text)
        deaths.append(f"<section class='death'><h3>{e(_t('attempt', lang))} {a.n}: {e(title)} <small>"
                      f"{e(d['cause'])} · {e(_t('confidence', lang))} {d['confidence']:.2f}</small></h3>"
                      f"<h4>{e(_t('evidence', lang))}</h4><ul>{evidence}</ul>"
                      f"<h4>{e(_t('what_to_do', lang))}</h4><ol>{fixes}</ol></section>")  # fmt: skip
    alert_items = "".join(f"<li>{e(_when(m.time))} — {e(m.label)}</li>" for m in alerts)
    limit = run.options.get("memory_limit")

    return f"""<!DOCTYPE html>
<html lang="{"zh" if lang == "zh" else "en"}"><head><meta charset="utf-8">
<title>trainguard run {e(run.id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; padding: 0 1rem; }}
table {{ border-collapse: collapse; width: 100%; }} td, th {{ border-bottom: 1px solid #ddd; padding: .3rem .5rem; text-align: left; vertical-align: top; }}
code {{ background: #f4f4f4; padding: 0 .2rem; word-break: break-all; }} .death {{ border-left: 4px solid #dc322f; padding-left: 1rem; margin: 1rem 0; }}
small {{ color: #666; font-weight: normal; }} .meta td:first-child {{ color: #666; width: 10rem; }}
.bar {{ display: flex; height: 1.6rem; border-radius: 4px; overflow: hidden; margin: .5rem 0; }} .part {{ min-width: 2px; }}
.legend {{ list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: .4rem 1.5rem; }}
.swatch {{ display: inline-block; width: .8rem; height: .8rem; margin-right: .35rem; border-radius: 2px; vertical-align: middle; }}
.goodput b {{ font-size: 1.4rem; }} .losses {{ margin-top: .5rem; }}
</style></head><body>
<h1>{e(_t("title", lang))} {e(run.id)} <small>{e(run.name or "")}</small></h1>
<table class="meta">
<tr><td>{e(_t("command", lang))}</td><td><code>{e(shlex.join(run.command))}</code></td></tr>
<tr><td>{e(_t("host", lang))}</td><td>{e(run.host)}</td></tr>
<tr><td>{e(_t("state", lang))}</td><td>{e(_t("state_" + PUBLIC_STATE[RunState(run.state)], lang))}{" — " + e(run.reason) if run.reason else ""}</td></tr>
<tr><td>{e(_t("started", lang))}</td><td>{e(_when(run.created_at))}</td></tr>
<tr><td>{e(_t("log", lang))}</td><td><code>{e(run.log_path)}</code></td></tr>
<tr><td>{e(_t("memory_limit", lang))}</td><td>{e(format_size(limit) if limit else _t("no_memory_limit", lang))}</td></tr>
<tr><td>{e(_t("gpus", lang))}</td><td>{e(_t("gpus_sampled" if any(s.get("gpus") for s in samples) else "gpus_none", lang))}</td></tr>
</table>
<h2>{e(_t("goodput", lang))}</h2>
{_goodput_section(result, lang)}
<h2>{e(_t("timeline", lang))}</h2>
{chart}
<h2>{e(_t("attempts", lang))}</h2>
<table><tr><th>{_t("col_n", lang)}</th><th>{e(_t("col_started", lang))}</th><th>{e(_t("col_ended", lang))}</th><th>{e(_t("col_how", lang))}</th><th>{e(_t("col_cause", lang))}</th><th>{e(_t("col_steps", lang))}</th><th>{e(_t("col_resumed", lang))}</th></tr>{"".join(rows)}</table>
<h2>{e(_t("deaths", lang))}</h2>
{"".join(deaths) or f"<p>{e(_t('no_death', lang))}</p>"}
<h2>{e(_t("alerts", lang))}</h2>
<ul>{alert_items or f"<li>{e(_t('none', lang))}</li>"}</ul>
</body></html>
"""
