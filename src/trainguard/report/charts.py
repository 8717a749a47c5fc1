"""The report's timeline: one plotly figure whose rows each sit on their own scale — training progress
with every checkpoint the supervisor recorded (pruned ones too) and the alerts, the job's memory
against its limit, host RAM, GPU memory against the card, utilisation, temperature, /dev/shm, free
disk — with each attempt shaded and labelled with how it ended."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from trainguard._terminal import visible
from trainguard.report.texts import escaped, tr
from trainguard.units import format_size

GIB = 1024**3


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
            label = f"checkpoint step {step}" if step is not None else "checkpoint"
            marker = Marker(float(e["time"]), label, "checkpoint", step, e.get("path"))
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
            rows.append(_Row(tr("row_rss_limit", lang, limit=format_size(limit)), [(tr("job_rss", lang), rss, {})],
                             (0.0, limit / GIB * 1.08), [(limit / GIB, f"{tr('limit', lang)} {format_size(limit)}")],
                             "%{y:.2f} GiB"))  # fmt: skip
        else:
            top = max(_max(rss) * 1.3, 0.05)
            rows.append(_Row(tr("row_rss_host", lang, total=format_size(host_total) if host_total else "?"),
                             [(tr("job_rss", lang), rss, {})], (0.0, top), [], "%{y:.2f} GiB"))  # fmt: skip
    available = host("mem_available")
    if any(v is not None for v in available):
        swap = host("swap_used")
        series = [(tr("ram_available", lang), available, {})]
        if any(v for v in swap):
            series.append((tr("swap_used", lang), swap, {"line": {"dash": "dot"}}))
        total = host_total / GIB if host_total else _max(available) * 1.1
        rows.append(_Row(tr("row_host", lang, total=format_size(host_total) if host_total else "?"), series,
                         (0.0, total * 1.05), [(total, format_size(host_total))] if host_total else [],
                         "%{y:.2f} GiB"))  # fmt: skip
    gpus = sorted({g["index"] for s in samples for g in s.get("gpus", [])})
    if gpus:
        cards = {i: _max(gpu(i, "memory_total", GIB)) for i in gpus}
        rows.append(_Row(tr("row_gpu_memory", lang), [(f"GPU {i}", gpu(i, "memory_used", GIB), {}) for i in gpus],
                         (0.0, max(cards.values()) * 1.05),
                         [(total, f"GPU {i} {tr('card', lang)} {total:.0f} GiB") for i, total in cards.items()],
                         "%{y:.2f} GiB"))  # fmt: skip
        utilisation = [(f"GPU {i}", gpu(i, "utilization"), {}) for i in gpus]
        if any(v is not None for _, values, _ in utilisation for v in values):
            rows.append(_Row(tr("row_gpu_util", lang), utilisation, (0.0, 105.0), [], "%{y:.0f}%"))
        temperature = [(f"GPU {i}", gpu(i, "temperature_c"), {}) for i in gpus]
        if any(v is not None for _, values, _ in temperature for v in values):
            hottest = _max(v for _, values, _ in temperature for v in values)
            rows.append(_Row(tr("row_gpu_temp", lang), temperature, (20.0, max(100.0, hottest + 5)), [(85.0, "85 °C")],
                             "%{y:.0f} °C"))  # fmt: skip
    shm_total = _max(s.get("shm_total") for s in samples)
    if shm_total:
        used = [100 * s["shm_used"] / s["shm_total"] if s.get("shm_total") and s.get("shm_used") is not None else None
                for s in samples]  # fmt: skip
        rows.append(_Row(tr("row_shm", lang, total=format_size(shm_total)), [("/dev/shm", used, {})], (0.0, 105.0), [],
                         "%{y:.1f}%"))  # fmt: skip
    paths = sorted({p for s in samples for p in s.get("disk_free", {})})
    if paths:
        names = {run.run_dir: tr("run_folder", lang), run.options.get("checkpoint_dir"): tr("checkpoint_folder", lang)}
        series = []
        for path in paths:
            label = visible(f"{names[path]} ({path})" if path in names else path)
            series.append((label, [s["disk_free"][path] / GIB if path in s.get("disk_free", {}) else None
                                   for s in samples], {}))  # fmt: skip
        top = _max(v for _, values, _ in series for v in values)
        rows.append(_Row(tr("row_disk", lang), series, (0.0, max(top * 1.15, 1.0)), [], "%{y:.2f} GiB"))
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
    progress_title = tr("row_progress" if with_steps else "row_checkpoints", lang)
    rows = [_Row(progress_title), *_resource_rows(samples, run, lang)]
    if not samples:
        rows.append(_Row(tr("no_samples", lang)))
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
            label = f"{tr('attempt', lang)} {attempt.n}"
            figure.add_scatter(x=[_dt(t) for t, _ in points], y=[s for _, s in points], mode="lines", name=label,
                               line={"color": palette[k % len(palette)], "width": 2}, row=1, col=1, showlegend=False,
                               hovertemplate=f"{label}: {tr('step', lang)} %{{y}}<extra></extra>")  # fmt: skip
    if checkpoints:
        ys = [m.step if m.step is not None else (0 if with_steps else 1) for m in checkpoints]
        texts = [visible(f"{tr('checkpoint', lang)} {tr('step', lang)} {m.step} · {m.path or ''}" if m.step is not None
                         else f"{tr('checkpoint', lang)} · {m.path or ''}") for m in checkpoints]  # fmt: skip
        figure.add_scatter(x=[_dt(m.time) for m in checkpoints], y=ys, mode="markers", name=tr("checkpoint", lang),
                           marker={"symbol": "diamond", "size": 9, "color": "#073642"}, hovertext=texts,
                           hoverinfo="text", row=1, col=1, showlegend=False)  # fmt: skip
    if alerts:
        figure.add_scatter(x=[_dt(m.time) for m in alerts], y=[top_step * 1.08] * len(alerts), mode="markers",
                           name=tr("alert", lang), marker={"symbol": "x", "size": 10, "color": "#cb4b16"},
                           hovertext=[m.label for m in alerts], hoverinfo="text", row=1, col=1,
                           showlegend=False)  # fmt: skip
    figure.update_yaxes(range=[0, top_step * 1.15] if with_steps else [0, 2], showticklabels=with_steps, row=1, col=1)
    # Attempts: shaded through every row, labelled once at the top with how each ended.
    for attempt in run.attempts:
        end = attempt.ended_at if attempt.ended_at is not None else now
        if attempt.cause:
            color, text, line = "rgba(220,50,47,0.10)", f"#{attempt.n} {attempt.cause}", "#dc322f"
        elif attempt.ended_at is None:
            color, text, line = "rgba(38,139,210,0.08)", f"#{attempt.n} {tr('running', lang)}", None
        elif run.state == "stopped" and attempt is run.attempts[-1]:
            color, text, line = "rgba(147,161,161,0.12)", f"#{attempt.n} {tr('stopped', lang)}", "#93a1a1"
        else:
            color, text, line = "rgba(133,153,0,0.08)", f"#{attempt.n} {tr('succeeded', lang)}", "#859900"
        figure.add_vrect(x0=_dt(attempt.started_at), x1=_dt(end), fillcolor=color, line_width=0, row="all", col=1)
        if line is not None:
            figure.add_vline(x=_dt(end).timestamp() * 1000, line_color=line, line_dash="dot", line_width=1.5)
        figure.add_annotation(x=_dt(attempt.started_at + (end - attempt.started_at) / 2), y=0.98, xref="x",
                              yref="y domain", yanchor="top", text=f"<b>{escaped(text)}</b>", showarrow=False,
                              font={"size": 12, "color": line or "#268bd2"},
                              bgcolor="rgba(255,255,255,0.7)")  # fmt: skip
    figure.update_layout(height=170 + 200 * len(rows), margin={"l": 60, "r": 30, "t": 70, "b": 40},
                         template="plotly_white", hovermode="x unified",
                         legend={"orientation": "h", "y": -0.02, "yanchor": "top"})  # fmt: skip
    figure.update_xaxes(showticklabels=True, tickformat="%H:%M:%S")
    figure.update_xaxes(tickformat=None, row=len(rows), col=1)  # the last row also says the date
    return figure
