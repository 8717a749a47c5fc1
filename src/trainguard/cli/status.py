"""``trainguard ps | status | report``: the runs as a list, one run's record (its attempts, the cause
of each death, its goodput) as a person reads it or as JSON, and one run's HTML page."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
from rich.cells import cell_len, set_cell_size

from trainguard import goodput, progress
from trainguard._i18n import choose_language
from trainguard._terminal import visible
from trainguard.cli.output import say
from trainguard.cli.params import open_registry
from trainguard.cli.render import STATE_ZH, shell_join
from trainguard.errors import UsageError
from trainguard.goodput import Goodput
from trainguard.paths import open_private
from trainguard.store.registry import Attempt, Registry, Run
from trainguard.store.states import PUBLIC_STATE, TERMINAL_STATES, RunState
from trainguard.supervisor import service
from trainguard.supervisor.attempt_files import progress_file
from trainguard.units import format_duration

STEP_REPORT_OLD_S = 60.0  # a running job's step report older than this is said to be old


def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds")


def _supervisor_word(run: Run) -> str:
    if service.watched_by(run) is not None:
        return "alive"
    return "gone" if RunState(run.state) not in TERMINAL_STATES else "exited"


def _reported_progress(run: Run, attempt: Attempt, watched: bool) -> dict[str, Any]:
    """What the attempt's job last reported. Its supervisor records the job's progress file every few
    seconds and once more at the attempt's end (adding ``last_active_time``); a job that went on with
    no supervisor (killed, or stopped unwatched) has written on since, so its own file is read then,
    and the newer report of the two wins."""
    recorded = attempt.progress or {}
    if watched or "last_active_time" in recorded:
        return recorded
    written = progress.read(progress_file(run.run_dir, attempt.n))
    return written if written.get("step_time", 0) > recorded.get("step_time", 0) else recorded


def run_goodput(registry: Registry, run: Run) -> Goodput:
    """What the run's failures cost, from its attempts and the checkpoints its supervisor recorded."""
    return goodput.of_run(run, registry.events(run.id, kinds=("checkpoint",)), now=time.time())


def run_json(run: Run, registry: Registry | None = None) -> dict[str, Any]:
    state = RunState(run.state)
    extra = {"goodput": run_goodput(registry, run).to_dict()} if registry is not None else {}
    supervisor = _supervisor_word(run)
    reported = {a.n: _reported_progress(run, a, supervisor == "alive") for a in run.attempts}
    return {
        "id": run.id,
        "name": run.name,
        "state": PUBLIC_STATE[state],
        "command": run.command,
        "pid": run.job_pid if state not in TERMINAL_STATES else None,
        "log_path": run.log_path,
        "host": run.host,
        "reason": run.reason,
        "supervisor": supervisor,
        "containment": run.containment,
        "checkpoint_dir": run.options.get("checkpoint_dir"),
        "checkpoint_interval": _checkpoint_interval(run, reported),
        "attempts": [
            {
                "n": a.n,
                "started_at": _iso(a.started_at),
                "ended_at": _iso(a.ended_at),
                "exit_code": a.exit_code,
                "signal": a.signal,
                "cause": a.cause,
                "confidence": a.confidence,
                "resumed_from": a.resumed_from,
                "resumed_step": reported[a.n].get("resumed_step"),
                "step": reported[a.n].get("step"),
                "step_time": _iso(reported[a.n].get("step_time")),
                "skipped_checkpoints": a.skipped or [],
                "diagnosis": a.diagnosis,
                "log_path": a.log_path or run.log_path,
            }
            for a in run.attempts
        ],
        **extra,
    }


def _checkpoint_interval(run: Run, reported: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The period the newest attempt's Checkpointer saves at, where it said (every="auto" chooses it
    and says why), and what a death then costs on average: half of it."""
    for attempt in reversed(run.attempts):
        seconds = reported[attempt.n].get("checkpoint_interval_s")
        if seconds is not None:
            return {"seconds": seconds, "why": reported[attempt.n].get("checkpoint_interval_why"),
                    "why_zh": reported[attempt.n].get("checkpoint_interval_why_zh"),
                    "expected_loss_per_death_s": seconds / 2}  # fmt: skip
    return None


NAME_COLUMNS = 32  # a longer name is cut in `ps` (`status` shows it whole): the columns after it stay in view


def _cut(text: str, columns: int) -> str:
    """``text`` in at most ``columns`` terminal columns (a Chinese character takes two), "…" for the rest."""
    return text if cell_len(text) <= columns else set_cell_size(text, columns - 1).rstrip() + "…"


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned columns, by terminal width; the last one is never padded (no trailing spaces) nor cut."""
    widths = [max(cell_len(cell) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(cell + " " * (width - cell_len(cell)) for cell, width in zip(row[:-1], widths)) + "  " + row[-1]
            for row in [header, *rows]]  # fmt: skip


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array, a run per element.")
def ps(as_json: bool) -> int:
    """List runs, newest first."""
    registry = open_registry()
    runs = registry.all()
    if as_json:
        click.echo(json.dumps([run_json(r, registry) for r in runs], ensure_ascii=False, indent=2))
        return 0
    if not runs:
        click.echo(say("no runs yet: trainguard run -- CMD", "还没有运行：trainguard run -- 命令"))
        return 0
    header = say("ID|STATE|ATTEMPTS|NAME|LAST DEATH|COMMAND", "ID|状态|尝试|名称|上次终止|命令").split("|")
    width = os.get_terminal_size().columns if sys.stdout.isatty() else None
    rows = []
    zh = choose_language(None, os.environ) == "zh"
    for r in runs:
        last_death = next((a.cause for a in reversed(r.attempts) if a.cause), None)  # one it recovered from too
        state = PUBLIC_STATE[RunState(r.state)]
        name = _cut(visible(r.name or "-"), NAME_COLUMNS)
        rows.append([r.id, STATE_ZH[state] if zh else state, str(len(r.attempts)), name, last_death or "-",
                     shell_join(r.command)])  # fmt: skip
    for line in _columns(header, rows):
        click.echo(_cut(line, width) if width else line)
    return 0


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(ref: str, as_json: bool) -> int:
    """A run's state, attempts and the cause of each death."""
    registry = open_registry()
    run_record = registry.resolve(ref)
    info = run_json(run_record, registry)
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False, indent=2))
        return 1 if info["state"] == "failed" else 0
    reason = run_record.reason_in(choose_language(None, os.environ))
    reason = f" — {reason}" if reason else ""
    name = visible(info["name"]) if info["name"] else None
    click.echo(say(f"run {info['id']} ({name or 'no name'}): {info['state']}{reason}",
                   f"运行 {info['id']}（{name or '无名称'}）：{STATE_ZH[info['state']]}{reason}"))  # fmt: skip
    click.echo(say(f"  command: {shell_join(info['command'])}\n  folder:  {visible(run_record.cwd)}\n"
                   f"  log:     {info['log_path']}",
                   f"  命令：{shell_join(info['command'])}\n  目录：{visible(run_record.cwd)}\n"
                   f"  日志：{info['log_path']}"))  # fmt: skip
    if info["supervisor"] == "gone":
        click.echo(say("  the supervisor is gone; the job may still be running unwatched (trainguard adopt)",
                       "  监督进程已不在；作业可能仍在无人监督地运行（trainguard adopt）"))  # fmt: skip
    if info["containment"] and info["containment"].startswith("partial") and info["state"] != "succeeded":
        why = info["containment"].removeprefix("partial").strip(" ()") or "no cgroup"
        click.echo(say(f"  containment is partial ({why}): what the job double-forks may outlive it",
                       f"  进程隔离不完整（{why}）：作业脱离会话的子进程可能残留"))  # fmt: skip
    for a in info["attempts"]:
        if a["exit_code"] is not None:
            end = say(f"exit {a['exit_code']}", f"退出码 {a['exit_code']}")
        elif a["signal"]:
            end = say(f"signal {a['signal']}", f"信号 {a['signal']}")
        else:
            end = say("running", "运行中") if a["ended_at"] is None else say("ended", "已结束")
        cause = f", {a['cause']} ({a['confidence']:.2f})" if a["cause"] else ""
        resumed = ""
        if a["resumed_from"]:
            at = f" (step {a['resumed_step']})" if a["resumed_step"] is not None else ""
            resumed = say(f", resumed from {a['resumed_from']}{at}", f"，从 {a['resumed_from']}{at} 恢复")
        step = say(f", step {a['step']}", f"，第 {a['step']} 步") if a["step"] is not None else ""
        if step and a["ended_at"] is None:
            step += _report_age(a["step_time"])
        click.echo(say(f"  attempt {a['n']}: ", f"  第 {a['n']} 次：")
                   + f"{a['started_at']} → {a['ended_at'] or '…'}  {end}{cause}{resumed}{step}")  # fmt: skip
    if interval := info["checkpoint_interval"]:
        every, loss = format_duration(interval["seconds"]), format_duration(interval["expected_loss_per_death_s"])
        why_en, why_zh = interval["why"] or "", interval["why_zh"] or interval["why"] or ""
        click.echo(say(f"  checkpoints: every {every}; a death costs {loss} of training on average ({why_en})",
                       f"  检查点：每 {every} 一次；每次终止平均损失 {loss} 的训练（{why_zh}）"))  # fmt: skip
    _print_goodput(run_goodput(registry, run_record))
    return 1 if info["state"] == "failed" else 0


def _report_age(stamp: str | None) -> str:
    """How long ago a running job reported its step, where that is long enough to matter: a job that
    has not moved, or a report nobody has read since."""
    if stamp is None:
        return ""
    age = time.time() - datetime.fromisoformat(stamp).timestamp()
    if age < STEP_REPORT_OLD_S:
        return ""
    return say(f" (reported {format_duration(age)} ago)", f"（{format_duration(age)}前报告）")


def _print_goodput(result: Goodput) -> None:
    if result.wall_s <= 0:  # nothing ran yet; an unknown ratio is said as such
        return
    lang = choose_language(None, os.environ)
    click.echo(say("  goodput: ", "  有效训练率（goodput）：") + goodput.describe(result, lang))
    for loss in result.losses:
        if loss.total_s > 0:
            click.echo("    " + goodput.describe_loss(loss, lang))


@click.command()
@click.argument("ref", metavar="RUN")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Where to write the page (default: the run's folder)."
)
def report(ref: str, output: str | None) -> int:
    """Write one self-contained HTML page of a run: its timeline, attempts, deaths and alerts."""
    from trainguard.checkpoint import layouts
    from trainguard.report.html import Marker, render

    registry = open_registry()
    record = registry.resolve(ref)
    # Checkpoints still in the folder that no event recorded (runs from before they were recorded).
    folder = record.options.get("checkpoint_dir")
    layout = record.options.get("checkpoint_layout", "auto")
    in_folder = [Marker(found.time, f"checkpoint step {found.step}", "checkpoint", found.step, found.path)
                 for found in (layouts.scan(folder, layout) if folder and not record.options.get("checkpoint_glob")
                               else []) if found.complete]  # fmt: skip
    page = render(record, registry.samples(record.id), registry.events(record.id),
                  lang=choose_language(None, os.environ), now=time.time(), extra_checkpoints=in_folder)  # fmt: skip
    target = Path(output) if output else Path(record.run_dir) / "report.html"
    _write_page(target, page)
    click.echo(str(target))
    return 0


def _write_page(target: Path, page: str) -> None:
    """Replace the file at ``target`` whole (renamed into place: a reader never sees half a page).
    Only a file is replaced: renaming over a device (`-o /dev/null`), a FIFO or a symbolic link would
    put the page where the machine's device, or the file the link names, was."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.lstat(target).st_mode):
            raise UsageError(f"{target} is not a regular file (a device, a FIFO, a folder or a link): give a file",
                             f"{target} 不是普通文件（设备、FIFO、文件夹或链接）：请给出文件路径")  # fmt: skip
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with open_private(tmp) as out:
            out.write(page)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise UsageError(f"cannot write {target}: {exc.strerror}", f"无法写入 {target}：{exc.strerror}") from exc
