"""``trainguard report``: one self-contained HTML page per run — a timeline of GPU memory, host RAM,
/dev/shm, disk, temperature and utilisation, with attempts, deaths, checkpoints and alerts marked,
and the diagnosis of each death with its evidence and fixes. Charts by plotly, its JavaScript inlined
so the page opens without a network. A pure function of the run's records."""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class Marker:
    time: float
    label: str
    kind: str  # "checkpoint" | "alert"


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "…"
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _dt(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, timezone.utc)


def _series(samples: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, list[float | None]]]]]:
    """The chart's rows, each a title and its named series; rows without any value are left out."""

    def gpu(index: int, key: str, scale: float = 1.0) -> list[float | None]:
        values = []
        for s in samples:
            found = next((g for g in s.get("gpus", []) if g["index"] == index), None)
            values.append(found[key] / scale if found and found.get(key) is not None else None)
        return values

    def host(key: str, scale: float = 1.0) -> list[float | None]:
        return [s[key] / scale if s.get(key) is not None else None for s in samples]

    gpus = sorted({g["index"] for s in samples for g in s.get("gpus", [])})
    paths = sorted({p for s in samples for p in s.get("disk_free", {})})
    rows = [
        ("GPU memory used (GiB)", [(f"GPU {i}", gpu(i, "memory_used", GIB)) for i in gpus]),
        (
            "Host RAM available / job RSS (GiB)",
            [("RAM available", host("mem_available", GIB)), ("job RSS", host("job_rss", GIB))],
        ),
        (
            "/dev/shm used (%)",
            [("/dev/shm", [100 * s["shm_used"] / s["shm_total"] if s.get("shm_total") else None for s in samples])],
        ),
        (
            "Free disk (GiB)",
            [
                (p, [s.get("disk_free", {}).get(p, 0) / GIB if p in s.get("disk_free", {}) else None for s in samples])
                for p in paths
            ],
        ),
        ("GPU temperature (°C)", [(f"GPU {i} °C", gpu(i, "temperature_c")) for i in gpus]),
        ("GPU utilisation (%)", [(f"GPU {i} util", gpu(i, "utilization")) for i in gpus]),
    ]
    return [(title, series) for title, series in rows if any(v is not None for _, values in series for v in values)]


def timeline_figure(samples: list[dict[str, Any]], attempts: list[Any], markers: list[Marker]) -> Any:
    from plotly.subplots import make_subplots

    rows = _series(samples) or [("No samples were recorded", [])]
    figure = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.05,
                           subplot_titles=[title for title, _ in rows])  # fmt: skip
    times = [_dt(s["time"]) for s in samples]
    for row, (_, series) in enumerate(rows, start=1):
        for name, values in series:
            figure.add_scatter(x=times, y=values, name=name, mode="lines", row=row, col=1)
    for attempt in attempts:
        if attempt.ended_at is None:
            continue
        died = attempt.cause is not None
        color = "rgba(220,50,47,0.10)" if died else "rgba(133,153,0,0.08)"
        figure.add_vrect(x0=_dt(attempt.started_at), x1=_dt(attempt.ended_at), fillcolor=color, line_width=0)
        label = f"attempt {attempt.n}: {attempt.cause}" if died else f"attempt {attempt.n}: ended"
        figure.add_vline(x=_dt(attempt.ended_at).timestamp() * 1000, line_color="#dc322f" if died else "#859900",
                         line_dash="dot", annotation_text=label, annotation_position="top left")  # fmt: skip
    for marker in markers:
        symbol = "diamond" if marker.kind == "checkpoint" else "x"
        figure.add_scatter(x=[_dt(marker.time)], y=[0], mode="markers", marker_symbol=symbol, marker_size=10,
                           name=marker.label, showlegend=False, hovertext=marker.label, row=1, col=1)  # fmt: skip
    figure.update_layout(height=max(300, 230 * len(rows)), margin={"l": 60, "r": 20, "t": 60, "b": 40},
                         template="plotly_white", legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})  # fmt: skip
    return figure


def render(run: Any, samples: list[dict[str, Any]], markers: list[Marker], *, lang: str = "en") -> str:
    figure = timeline_figure(samples, run.attempts, markers)
    chart = figure.to_html(full_html=False, include_plotlyjs="inline", config={"displaylogo": False})
    e = html.escape
    rows = []
    for a in run.attempts:
        end = f"exit {a.exit_code}" if a.exit_code is not None else (f"signal {a.signal}" if a.signal else "running")
        cause = f"{a.cause} ({a.confidence:.2f})" if a.cause else "—"
        rows.append(f"<tr><td>{a.n}</td><td>{e(_when(a.started_at))}</td><td>{e(_when(a.ended_at))}</td>"
                    f"<td>{e(end)}</td><td>{e(cause)}</td><td>{e(a.resumed_from or '')}</td></tr>")  # fmt: skip
    deaths = []
    for a in run.attempts:
        if not a.diagnosis:
            continue
        d = a.diagnosis
        evidence = "".join(
            f"<li><code>{e(ev['source'])}{':' + str(ev['line']) if ev.get('line') else ''}</code> {e(ev['text'])}</li>"
            for ev in d["evidence"]
        )
        fixes = "".join(f"<li>{e(fix)}</li>" for fix in d["fixes"])
        deaths.append(f"<section class='death'><h3>Attempt {a.n}: {e(d['title'])} <small>{e(d['cause'])} · "
                      f"confidence {d['confidence']:.2f}</small></h3><h4>Evidence</h4><ul>{evidence}</ul>"
                      f"<h4>What to do</h4><ol>{fixes}</ol></section>")  # fmt: skip
    alerts = "".join(f"<li>{e(_when(m.time))} — {e(m.label)}</li>" for m in markers if m.kind == "alert")
    return f"""<!DOCTYPE html>
<html lang="{"zh" if lang == "zh" else "en"}"><head><meta charset="utf-8">
<title>trainguard run {e(run.id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }} td, th {{ border-bottom: 1px solid #ddd; padding: .3rem .5rem; text-align: left; }}
code {{ background: #f4f4f4; padding: 0 .2rem; }} .death {{ border-left: 4px solid #dc322f; padding-left: 1rem; margin: 1rem 0; }}
small {{ color: #666; font-weight: normal; }} .meta td:first-child {{ color: #666; width: 10rem; }}
</style></head><body>
<h1>trainguard · run {e(run.id)} <small>{e(run.name or "")}</small></h1>
<table class="meta">
<tr><td>command</td><td><code>{e(" ".join(run.command))}</code></td></tr>
<tr><td>host</td><td>{e(run.host)}</td></tr>
<tr><td>state</td><td>{e(run.state)}{" — " + e(run.reason) if run.reason else ""}</td></tr>
<tr><td>started</td><td>{e(_when(run.created_at))}</td></tr>
<tr><td>log</td><td><code>{e(run.log_path)}</code></td></tr>
<tr><td>GPUs</td><td>{"sampled" if any(s.get("gpus") for s in samples) else "none sampled (no NVIDIA GPU visible)"}</td></tr>
</table>
<h2>Timeline</h2>
{chart}
<h2>Attempts</h2>
<table><tr><th>#</th><th>started</th><th>ended</th><th>how</th><th>cause</th><th>resumed from</th></tr>{"".join(rows)}</table>
<h2>Deaths</h2>
{"".join(deaths) or "<p>No attempt died.</p>"}
<h2>Alerts</h2>
<ul>{alerts or "<li>none</li>"}</ul>
</body></html>
"""
