"""``trainguard report``: one self-contained HTML page per run. A timeline whose rows each sit on their
own scale — training progress with every checkpoint the supervisor recorded (pruned ones too), the
job's memory against its limit, host RAM, GPU memory against the card, utilisation, temperature,
/dev/shm, free disk — with each attempt shaded and labelled with its cause of death; what the deaths
cost (goodput); the diagnosis of each death with its evidence and fixes; the alerts. Charts by
plotly, its JavaScript inlined so the page opens without a network. English or Chinese. A pure
function of the run's records. Every recorded text (names, commands, lines quoted from a log) is
escaped, with its control characters made visible (a bidi override would reorder what follows).
The timeline's figure is built in charts, and every text comes from texts."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from trainguard import causes
from trainguard import goodput as goodput_module
from trainguard._terminal import visible
from trainguard.report.charts import Marker, checkpoint_markers, timeline_figure
from trainguard.report.texts import escaped, tr
from trainguard.store.states import PUBLIC_STATE, RunState
from trainguard.units import format_duration, format_size


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "…"
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _goodput_section(result: goodput_module.Goodput, lang: str) -> str:
    e = escaped
    if result.ratio is None:
        return f"<p>{e(goodput_module.describe(result, lang))}</p>"
    redone = result.recomputed_s - result.never_saved_s
    parts = [("kept", result.kept_s, "#859900"), ("recomputed", redone, "#dc322f"),
             ("lost_never_saved", result.never_saved_s, "#d33682"), ("unsaved", result.unsaved_s, "#b58900"),
             ("restart", result.restart_s, "#cb4b16"), ("stalled", result.stalled_s, "#6c71c4"),
             ("overhead", result.overhead_s, "#93a1a1")]  # fmt: skip
    bar = "".join(
        f"<div class='part' style='flex:{seconds:.6f};background:{color}' title='{e(tr(key, lang))}: "
        f"{e(format_duration(seconds))}'></div>"
        for key, seconds, color in parts
        if seconds > 0
    )
    legend = "".join(
        f"<li><span class='swatch' style='background:{color}'></span>{e(tr(key, lang))}: "
        f"<b>{e(format_duration(seconds))}</b> ({100 * seconds / result.wall_s:.1f}%)</li>"
        for key, seconds, color in parts
        if seconds > 0
    )
    losses = "".join(
        f"<tr><td>{loss.attempt}</td><td>{e(loss.cause or tr('stopped', lang))}</td>"
        f"<td>{e(format_duration(loss.recomputed_s))}"
        f"{'' if loss.redone else ' ' + e(tr('never_saved', lang))}"
        f"{f' ({goodput_module.steps_text(loss.recomputed_steps, lang)})' if loss.recomputed_steps else ''}</td>"
        f"<td>{e(format_duration(loss.restart_s))}</td><td>{e(format_duration(loss.stalled_s))}</td>"
        f"<td>{e(tr('by_' + loss.measured_by, lang))}</td></tr>"
        for loss in result.losses
    )
    table = (
        f"<table class='losses'><tr><th>{tr('attempt', lang)}</th><th>{tr('loss_cause', lang)}</th>"
        f"<th>{tr('loss_recomputed', lang)}</th><th>{tr('loss_restart', lang)}</th><th>{tr('loss_stalled', lang)}</th>"
        f"<th>{tr('measured_by', lang)}</th></tr>{losses}</table>"
        if losses
        else ""
    )
    paused = (f"<p><small>{e(tr('paused', lang))}: {e(format_duration(result.paused_s))}</small></p>"
              if result.paused_s > 0 else "")  # fmt: skip
    headline = tr("headline", lang, kept=format_duration(result.kept_s), wall=format_duration(result.wall_s))
    lost = tr("lost_line", lang, recomputed=format_duration(redone),
              never_saved=format_duration(result.never_saved_s),
              restart=format_duration(result.restart_s), stalled=format_duration(result.stalled_s))  # fmt: skip
    return (f"<p class='goodput'><b>{100 * result.ratio:.0f}%</b> {e(headline)}</p><p>{e(lost)}</p>"
            f"<div class='bar'>{bar}</div><ul class='legend'>{legend}</ul>"
            f"<p><small>{e(tr('measured_by', lang))}: {e(tr('by_' + result.measured_by, lang))}</small></p>"
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
    e = escaped
    rows = []
    for a in run.attempts:
        if a.exit_code is not None:
            end = f"{tr('exit', lang)} {a.exit_code}"
        elif a.signal:
            end = f"{tr('signal', lang)} {a.signal}"
        else:
            end = tr("running", lang) if a.ended_at is None else "—"
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
        deaths.append(f"<section class='death'><h3>{e(tr('attempt', lang))} {a.n}: {e(title)} <small>"
                      f"{e(d['cause'])} · {e(tr('confidence', lang))} {d['confidence']:.2f}</small></h3>"
                      f"<h4>{e(tr('evidence', lang))}</h4><ul>{evidence}</ul>"
                      f"<h4>{e(tr('what_to_do', lang))}</h4><ol>{fixes}</ol></section>")  # fmt: skip
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
<h1>{e(tr("title", lang))} {e(run.id)} <small>{e(run.name or "")}</small></h1>
<table class="meta">
<tr><td>{e(tr("command", lang))}</td><td><code>{e(shlex.join(run.command))}</code></td></tr>
<tr><td>{e(tr("host", lang))}</td><td>{e(run.host)}</td></tr>
<tr><td>{e(tr("state", lang))}</td><td>{e(tr("state_" + PUBLIC_STATE[RunState(run.state)], lang))}{" — " + e(run.reason) if run.reason else ""}</td></tr>
<tr><td>{e(tr("started", lang))}</td><td>{e(_when(run.created_at))}</td></tr>
<tr><td>{e(tr("log", lang))}</td><td><code>{e(run.log_path)}</code></td></tr>
<tr><td>{e(tr("memory_limit", lang))}</td><td>{e(format_size(limit) if limit else tr("no_memory_limit", lang))}</td></tr>
<tr><td>{e(tr("gpus", lang))}</td><td>{e(tr("gpus_sampled" if any(s.get("gpus") for s in samples) else "gpus_none", lang))}</td></tr>
</table>
<h2>{e(tr("goodput", lang))}</h2>
{_goodput_section(result, lang)}
<h2>{e(tr("timeline", lang))}</h2>
{chart}
<h2>{e(tr("attempts", lang))}</h2>
<table><tr><th>{tr("col_n", lang)}</th><th>{e(tr("col_started", lang))}</th><th>{e(tr("col_ended", lang))}</th><th>{e(tr("col_how", lang))}</th><th>{e(tr("col_cause", lang))}</th><th>{e(tr("col_steps", lang))}</th><th>{e(tr("col_resumed", lang))}</th></tr>{"".join(rows)}</table>
<h2>{e(tr("deaths", lang))}</h2>
{"".join(deaths) or f"<p>{e(tr('no_death', lang))}</p>"}
<h2>{e(tr("alerts", lang))}</h2>
<ul>{alert_items or f"<li>{e(tr('none', lang))}</li>"}</ul>
</body></html>
"""
