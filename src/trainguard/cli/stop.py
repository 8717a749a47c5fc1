"""``trainguard stop``: end a run with its stop signal and the grace period for a last checkpoint,
through its supervisor, or as its supervisor would where it has none."""

from __future__ import annotations

import os
import signal
import time

import click

from trainguard._i18n import choose_language
from trainguard.cli.output import say
from trainguard.cli.params import as_duration, open_registry
from trainguard.cli.render import STATE_ZH, ended_line
from trainguard.errors import UsageError
from trainguard.store.registry import Registry, RegistryError, Run
from trainguard.store.states import TERMINAL_STATES, RunState
from trainguard.supervisor import service
from trainguard.supervisor.lock import AlreadyWatched


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the run has stopped.")
@click.option("--grace", callback=as_duration, metavar="DUR",
              help="Time between the stop signal and SIGKILL (default: the run's --grace).")  # fmt: skip
def stop(ref: str, wait: bool, grace: float | None) -> int:
    """Stop a run: its stop signal, the grace period for a checkpoint, then SIGKILL."""
    asked = time.time()
    registry = open_registry()
    run_record = registry.resolve(ref)
    if RunState(run_record.state) in TERMINAL_STATES:
        raise UsageError(f"run {run_record.id} is not running ({run_record.state})",
                         f"运行 {run_record.id} 没有在运行（{run_record.state}）")  # fmt: skip
    grace_s = float(grace if grace is not None else run_record.options.get("grace_s", 120))
    holder = service.watched_by(run_record)
    if holder is None:
        try:
            what = service.stop_unwatched(registry, run_record, grace_s)
        except AlreadyWatched:  # another `stop` (or an adopt) got there first: wait for its outcome
            return _wait_stopped(registry, run_record, grace_s, wait, asked)
        click.echo(say(f"run {run_record.id}: stopped ({what.en})", f"运行 {run_record.id}：已停止（{what.zh}）"))
        return 0
    try:
        if not registry.request_stop(run_record.id, grace_s):
            raise UsageError(f"run {run_record.id} is already being stopped", f"运行 {run_record.id} 已在停止中")
    except RegistryError as exc:  # a full state disk: the stop still happens, with the run's own grace
        click.echo(f"trainguard: warning: {exc.message(choose_language(None, os.environ))}", err=True)
    # The holder now, after the request: a supervisor that took the run over from the command that
    # created it (the holder read above) has read the request or gets this signal.
    holder = service.watched_by(run_record) or holder
    if not holder.signal(signal.SIGTERM):
        registry.request_stop(run_record.id, grace_s, replace_stale=True)
        try:
            what = service.stop_unwatched(registry, run_record, grace_s)  # its supervisor died a moment ago
        except AlreadyWatched:  # or a supervisor took the run over a moment ago: the request reaches it
            return _wait_stopped(registry, run_record, grace_s, wait, asked)
        click.echo(say(f"run {run_record.id}: stopped ({what.en})", f"运行 {run_record.id}：已停止（{what.zh}）"))
        return 0
    return _wait_stopped(registry, run_record, grace_s, wait, asked)


def _ended_since(registry: Registry, run_id: str, since: float) -> str | None:
    """The state the run ended in after ``since``, if it ended then (it may have been continued since)."""
    try:
        events = registry.events(run_id)
    except RegistryError:
        return None
    terminal = {state.value for state in TERMINAL_STATES}
    for event in events:
        state = event["kind"].removeprefix("state:")
        if event["kind"].startswith("state:") and event["time"] >= since and state in terminal:
            return state
    return None


def _wait_stopped(registry: Registry, run_record: Run, grace_s: float, wait: bool, asked: float) -> int:
    if not wait:
        return 0
    deadline = time.monotonic() + grace_s + 30
    while time.monotonic() < deadline:
        current = registry.get(run_record.id)
        if RunState(current.state) in TERMINAL_STATES:
            click.echo(ended_line(current))
            return 0
        ended = _ended_since(registry, current.id, asked)
        if ended is not None:  # and was continued again by a command that came after this one
            click.echo(say(f"run {current.id}: {ended}, then continued again by a later command (now {current.state})",
                           f"运行 {current.id}：{STATE_ZH[ended]}，"
                           f"随后又被之后的命令继续（现在 {current.state}）"))  # fmt: skip
            return 0
        time.sleep(0.2)
    click.echo(say(f"run {run_record.id}: still stopping", f"运行 {run_record.id}：仍在停止中"), err=True)
    return 1
