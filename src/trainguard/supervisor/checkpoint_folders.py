"""Which runs of this machine share a checkpoint folder. A run's checkpoints are its own: a folder
that an active run of this machine records as its checkpoint folder (the one it learnt from its job
included), or one inside it or around it (compared after symlinks: one folder may have two names), is
refused for another run, naming the run that holds it; and a run never resumes from a checkpoint that
another run of this machine wrote after it began (``other_runs``, for ``choose_resume``). An attempt
that finds its run's folder gone says that it starts fresh.

Runs of other machines do not count: the nodes of one job share one folder on shared storage by
design, each under a supervisor of its own (a registry on a shared home lists them all, each with its
host). Nor do runs recorded active under an earlier boot: they died with it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

from trainguard._i18n import Text
from trainguard.checkpoint.resume import OtherRuns
from trainguard.errors import TrainguardError, UsageError
from trainguard.store.journal import Journal
from trainguard.store.records import ACTIVE
from trainguard.store.registry import Registry, Run, boot_id
from trainguard.supervisor.attempt_files import append_marker


def overlap(folder: str, other: str) -> str | None:
    """How ``folder`` meets ``other``: "same", "inside" (it is below ``other``), "around" (``other``
    is below it), or None."""
    mine, theirs = os.path.realpath(folder), os.path.realpath(other)
    if mine == theirs:
        return "same"
    common = os.path.commonpath([mine, theirs])
    if common == theirs:
        return "inside"
    if common == mine:
        return "around"
    return None


def holder(runs: Iterable[Run], folder: str, *, except_run: str | None = None) -> tuple[Run, str] | None:
    """The active run of this machine whose checkpoint folder meets ``folder``, and how it meets it."""
    host, boot = socket.gethostname(), boot_id()
    for run in runs:
        if run.id == except_run or run.state not in ACTIVE or run.host != host:
            continue
        if boot is not None and run.boot_id not in (None, boot):
            continue
        theirs = run.options.get("checkpoint_dir")
        how = overlap(folder, theirs) if isinstance(theirs, str) and theirs else None
        if how is not None:
            return run, how
    return None


def refuse_if_held(registry: Registry, folder: str, *, except_run: str | None = None) -> None:
    """One line and the fix when an active run of this machine uses ``folder`` (or a folder inside it
    or around it). Reads the registry only: inside the transaction that creates a run it is exact,
    two `trainguard run` started together cannot both pass."""
    found = holder(registry.all(), folder, except_run=except_run)
    if found is None:
        return
    run, how = found
    theirs = run.options["checkpoint_dir"]
    who = f"run {run.id} ({run.name})" if run.name else f"run {run.id}"
    who_zh = f"运行 {run.id}（{run.name}）" if run.name else f"运行 {run.id}"
    where = {
        "same": ("is the checkpoint folder of", "是"),
        "inside": (f"is inside {theirs}, the checkpoint folder of", f"位于 {theirs} 之内，该目录是"),
        "around": (f"holds {theirs}, the checkpoint folder of", f"包含 {theirs}，该目录是"),
    }[how]
    raise UsageError(
        f"--checkpoint-dir {folder} {where[0]} {who}, active on this machine ({run.state}): two runs in one "
        f"folder resume from and prune each other's checkpoints; give this run another --checkpoint-dir, or "
        f"stop that run first (trainguard stop {run.ref})",
        f"--checkpoint-dir {folder} {where[1]}本机上正在进行（{run.state}）的{who_zh}的检查点目录："
        f"两个运行共用一个目录会互相恢复、互相清理对方的检查点；请为此运行指定另一个 --checkpoint-dir，"
        f"或先停止该运行（trainguard stop {run.name or run.id}）",
    )


def other_runs(registry: Registry, run: Run) -> OtherRuns:
    """The runs whose checkpoints ``run`` must not resume from: every other run of this machine in
    its registry, for what they wrote after ``run`` was created (an older checkpoint of an ended run
    is a folder handed over on purpose). A registry that cannot be read leaves none out."""
    try:
        ids = frozenset(r.id for r in registry.all() if r.id != run.id and r.host == run.host)
    except TrainguardError:  # a registry error, or a run folder it no longer trusts
        ids = frozenset()
    return OtherRuns(ids=ids, since=run.created_at)


def say_it_starts_fresh(journal: Journal, n: int, folder: str, log_file: str) -> None:
    """Attempt ``n``, after the first, finds its run's checkpoint folder gone (removed, or moved): it
    starts fresh, and says so in an event of its run and as the first line of its log."""
    journal.event("checkpoint_dir_gone", {"attempt": n, "folder": folder})
    said = Text(
        f"the checkpoint folder {folder} is gone: attempt {n} starts fresh, from no checkpoint",
        f"检查点目录 {folder} 已不存在：第 {n} 次尝试从头开始，不从任何检查点恢复",
    )
    append_marker(log_file, said)
