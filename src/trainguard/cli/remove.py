"""``trainguard rm`` and ``trainguard prune``: remove ended runs, their records and logs, and their
checkpoint folders when asked, saying what went and the space it freed. How a removal is planned and
done, and why a crash in it is harmless, is :mod:`trainguard.cli.removal`'s."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import click

from trainguard._i18n import Text
from trainguard._terminal import visible
from trainguard.cli.output import say
from trainguard.cli.params import as_duration, open_registry
from trainguard.cli.removal import (
    Removal,
    RunInUse,
    check_not_held,
    hold,
    plan_leftover,
    plan_run,
    remove_files,
    remove_run,
)
from trainguard.cli.render import STATE_ZH
from trainguard.errors import UsageError
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, Run
from trainguard.store.states import PUBLIC_STATE, TERMINAL_STATES, RunState
from trainguard.supervisor.lock import SupervisorLock
from trainguard.units import format_duration, format_size

_CHECKPOINTS_HELP = "Also remove each run's checkpoint folder (never one that another run records)."
_DRY_RUN_HELP = "List what would be removed and the space it would free; remove nothing."


def _label(run_id: str, name: str | None) -> Text:
    return Text(f"{run_id} ({visible(name)})", f"{run_id}（{visible(name)}）") if name else Text(run_id, run_id)


def _refuse(run: Run, in_use: RunInUse | None = None) -> UsageError:
    label = _label(run.id, run.name)
    if in_use is None:
        state = PUBLIC_STATE[RunState(run.state)]
        return UsageError(f"run {label.en} is {state}: stop it first (trainguard stop {run.id}); nothing was removed",
                          f"运行 {label.zh} {STATE_ZH[state]}：请先停止它（trainguard stop {run.id}）；"
                          "没有删除任何东西")  # fmt: skip
    pid = in_use.pid
    who_en, who_zh = (f"supervisor {pid}", f"监督进程 {pid}") if pid else ("its supervisor", "监督进程")
    return UsageError(f"run {label.en} is still held by {who_en} (it runs, or is finishing): nothing was removed",
                      f"运行 {label.zh} 仍被{who_zh}持有（仍在运行或正在收尾）：没有删除任何东西")  # fmt: skip


@click.command()
@click.argument("refs", nargs=-1, required=True, metavar="RUN...")
@click.option("--checkpoints", is_flag=True, help=_CHECKPOINTS_HELP)
@click.option("--dry-run", is_flag=True, help=_DRY_RUN_HELP)
def rm(refs: tuple[str, ...], checkpoints: bool, dry_run: bool) -> int:
    """Remove ended runs: their records and logs, and with --checkpoints their checkpoint folders.

    A RUN is an id, a name or the start of an id. When one of them is not ended (running, restarting,
    stopping, or its supervisor still holds it) the command refuses it and removes nothing, none of
    the others either: stop it first (trainguard stop RUN)."""
    registry = open_registry()
    runs = list({run.id: run for run in (registry.resolve(ref) for ref in refs)}.values())
    for run in runs:
        if RunState(run.state) not in TERMINAL_STATES:
            raise _refuse(run)
    if dry_run:
        for run in runs:
            _check_free(run)
        return _report(_plans(registry, runs, checkpoints), [], dry_run=True)
    locks: list[SupervisorLock] = []
    try:
        for run in runs:
            try:
                lock = hold(Path(run.run_dir), run.id)
            except RunInUse as exc:
                raise _refuse(run, exc) from None
            if lock is not None:
                locks.append(lock)
            current = registry.get(run.id)
            if current is None:  # another command removed it while this one waited
                raise UsageError(f"run {run.id} was removed meanwhile by another command",
                                 f"运行 {run.id} 已被另一个命令删除")  # fmt: skip
            if RunState(current.state) not in TERMINAL_STATES:
                raise _refuse(current)
        removals = _plans(registry, runs, checkpoints)
        failed = [line for removal in removals for line in remove_run(registry, removal)]
    except RunInUse:  # held by this command: only a registry replaced under it gets here
        raise UsageError("the run registry changed during the removal: see trainguard ps",
                         "删除过程中运行记录库发生了变化：请查看 trainguard ps") from None  # fmt: skip
    finally:
        for lock in locks:
            lock.release()
    return _report(removals, failed, dry_run=False)


@click.command()
@click.option("--older-than", "older_than", callback=as_duration, metavar="DUR",
              help="Remove the runs that ended more than DUR ago (e.g. 30d, 12h).")  # fmt: skip
@click.option("--checkpoints", is_flag=True, help=_CHECKPOINTS_HELP)
@click.option("--dry-run", is_flag=True, help=_DRY_RUN_HELP)
def prune(older_than: float | None, checkpoints: bool, dry_run: bool) -> int:
    """Remove every run that ended more than DUR ago: records and logs, with --checkpoints their
    checkpoint folders. A run that is not ended is never touched.

    Also finishes what an interrupted removal left in the state folder (a run folder that no record
    names, unchanged for DUR): its files, and its checkpoints only with --checkpoints."""
    if older_than is None:  # asked for here, not by Click: its "[required]" has no Chinese
        raise UsageError("prune needs --older-than DUR: the runs that ended more than DUR ago go (e.g. 30d)",
                         "prune 需要 --older-than DUR：删除在 DUR 之前结束的运行（例如 30d）")  # fmt: skip
    registry = open_registry()
    cutoff = time.time() - older_than
    ended = registry.ended_times()
    runs = [run for run in registry.all() if run.id in ended and ended[run.id] < cutoff]
    kept_back = [run for run in runs if not _free(run)]
    runs = [run for run in runs if run.id not in {held.id for held in kept_back}]
    for run in kept_back:
        label = _label(run.id, run.name)
        click.echo(say(f"skipped run {label.en}: its supervisor still holds it",
                       f"跳过运行 {label.zh}：它的监督进程仍持有它"), err=True)  # fmt: skip
    removals = _plans(registry, runs, checkpoints) + _leftovers(registry, cutoff, checkpoints)
    if not removals:
        click.echo(say(f"nothing to remove: no run ended more than {format_duration(older_than)} ago",
                       f"没有可删除的：没有在 {format_duration(older_than)} 之前结束的运行"))  # fmt: skip
        return 0
    if dry_run:
        return _report(removals, [], dry_run=True)
    done, failed = [], []
    for removal in removals:
        with contextlib.suppress(RunInUse):  # continued or taken since it was listed: it stays
            failed += _remove_one(registry, removal)
            done.append(removal)
    return _report(done, failed, dry_run=False)


def _free(run: Run) -> bool:
    try:
        check_not_held(Path(run.run_dir))
    except RunInUse:
        return False
    return True


def _check_free(run: Run) -> None:
    try:
        check_not_held(Path(run.run_dir))
    except RunInUse as exc:
        raise _refuse(run, exc) from None


def _plans(registry: Registry, runs: list[Run], checkpoints: bool) -> list[Removal]:
    going = {run.id for run in runs}
    others = [run for run in registry.all() if run.id not in going]
    return [plan_run(run, others, state_dir(), checkpoints=checkpoints) for run in runs]


def _leftovers(registry: Registry, cutoff: float, checkpoints: bool) -> list[Removal]:
    """What interrupted removals left: folders no record names, unchanged since ``cutoff`` and held
    by no supervisor (one whose record vanished with the registry puts it back)."""
    others = registry.all()
    found = []
    for folder in registry.unrecorded_run_folders():
        with contextlib.suppress(OSError, RunInUse):
            if folder.stat().st_mtime < cutoff:
                check_not_held(folder)
                removal = plan_leftover(folder, others, state_dir(), checkpoints=checkpoints)
                if not removal.empty:
                    found.append(removal)
    return found


def _remove_one(registry: Registry, removal: Removal) -> list[str]:
    lock = hold(removal.run_dir, removal.run_id)
    try:
        return remove_files(removal) if removal.leftover else remove_run(registry, removal)
    finally:
        if lock is not None:
            lock.release()


def _line(removal: Removal, dry_run: bool) -> str:
    label = _label(removal.run_id, removal.name)
    if removal.leftover:
        en, zh = f"what the removal of run {label.en} left: files", f"删除运行 {label.zh} 时留下的：文件"
    else:
        en, zh = f"run {label.en}: record and logs", f"运行 {label.zh}：记录和日志"
    en, zh = f"{en} {format_size(removal.files_bytes)}", f"{zh} {format_size(removal.files_bytes)}"
    if removal.checkpoint_dir is not None:
        en += f", checkpoints {format_size(removal.checkpoint_bytes)}"
        zh += f"，检查点 {format_size(removal.checkpoint_bytes)}"
    elif removal.kept is not None:
        where = visible(str(removal.kept))
        why_en, why_zh = (f" ({removal.kept_why.en})", f"（{removal.kept_why.zh}）") if removal.kept_why else ("", "")
        en += f"; checkpoints kept in {where}{why_en}"
        zh += f"；检查点保留在 {where}{why_zh}"
    return say(f"would remove {en}" if dry_run else f"removed {en}", f"将删除{zh}" if dry_run else f"已删除{zh}")


def _report(removals: list[Removal], failed: list[str], *, dry_run: bool) -> int:
    for removal in removals:
        click.echo(_line(removal, dry_run))
    freed = format_size(sum(removal.freed for removal in removals))
    runs = sum(not removal.leftover for removal in removals)
    left = len(removals) - runs
    en = f"{runs} run(s)" + (f" and what {left} cut-short removal(s) left" if left else "")
    zh = f"{runs} 个运行" + (f"以及 {left} 次中断的删除留下的文件" if left else "")
    if dry_run:
        click.echo(say(f"would remove {en}, freeing {freed}", f"将删除 {zh}，可释放 {freed}"))
        return 0
    click.echo(say(f"removed {en}, freed {freed}", f"已删除 {zh}，释放了 {freed}"))
    for line in failed:
        click.echo(say(f"trainguard: warning: could not remove {visible(line)} (trainguard prune removes it later)",
                       f"trainguard：警告：无法删除 {visible(line)}（之后 trainguard prune 会删除它）"),
                   err=True)  # fmt: skip
    return 1 if failed else 0
