"""Removing ended runs from the state folder (`trainguard rm`, `trainguard prune`): what a removal
takes (the run's record, its folder, and its checkpoint folder only when asked and only where no other
run records it), the space it frees, and the order that keeps a crash at any moment harmless.

The order: the run's supervisor lock is taken, so no `restart` or `adopt` can start the run meanwhile
(and a supervisor still finishing its end is waited for); a note of what is to go is written into the
run's folder; the record goes, in one transaction that checks the run is still ended; then the files.
A crash before the record goes leaves the run as it was (`rm` it again). After it, a run folder that no
record names: `prune` finishes that removal as its note says (a folder without a note loses its files
and keeps its ``checkpoints`` unless --checkpoints). Checkpoints kept by a removal stay in the run's
folder, with the note, until a `prune --checkpoints` takes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard._i18n import Text
from trainguard._untrusted import load_object
from trainguard.checkpoint import layouts
from trainguard.store.registry import Registry, Run
from trainguard.supervisor import lock as run_lock

NOTE = "removal.json"  # in a run's folder from just before its record goes
DEFAULT_CHECKPOINTS = "checkpoints"  # a run's checkpoint folder in its own folder, unless --checkpoint-dir
FINISHING_S = 3.0  # how long a supervisor that has recorded its run's end may take to let go of it


class RunInUse(Exception):
    """The run's supervisor holds it: the run runs, or its supervisor has not finished yet."""

    def __init__(self, pid: int | None = None) -> None:
        super().__init__(pid)
        self.pid = pid


@dataclass
class Removal:
    """What removing one run, or finishing the cut-short removal of one, takes."""

    run_id: str
    name: str | None
    run_dir: Path
    leftover: bool = False  # a folder that no record names
    files_bytes: int = 0  # the run's folder, less the checkpoints
    checkpoint_dir: Path | None = None  # removed too
    checkpoint_bytes: int = 0
    kept: Path | None = None  # a checkpoint folder left as it is
    kept_why: Text | None = None  # why, where the user asked for it to go
    keep_entry: str | None = None  # the entry of run_dir that holds ``kept``, which stays with the note
    keep_all: bool = False  # ``kept`` is run_dir itself: only the record goes
    cwd: str | None = None  # the run's working folder, which no removal takes
    layout: str = "auto"  # how the run's checkpoints are laid out (run --checkpoint-layout)
    checkpoint_glob: str | None = None  # run --checkpoint-glob: the files that are its checkpoints

    @property
    def freed(self) -> int:
        return self.files_bytes + self.checkpoint_bytes

    @property
    def empty(self) -> bool:
        """Nothing to remove: a leftover folder that holds only the checkpoints it keeps."""
        return self.leftover and self.files_bytes == 0 and self.checkpoint_dir is None


def disk_usage(path: Path, skip: tuple[str, ...] = ()) -> int:
    """The bytes that removing ``path`` frees: every file's blocks once (hard links too), no symlink
    followed; ``skip``: entries of ``path`` that stay."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder, dirs, files in os.walk(path):
        if folder == str(path):
            dirs[:] = [d for d in dirs if d not in skip]
        for name in (*files, *dirs):
            if folder == str(path) and name in skip:
                continue
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(folder, name))
                if (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
    return total


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(path))


def _must_stay(folder: Path, removal: Removal, others: list[Run], state_dir: Path) -> Text | None:
    """Why the checkpoint folder ``folder`` must not go with ``removal``'s run."""
    if folder.is_symlink():
        return Text("it is a symbolic link, not followed", "它是符号链接，不跟随")
    real = _real(folder)
    if _inside(_real(state_dir), real) or _inside(_real(Path.home()), real):
        return Text("it holds the state folder or your home folder", "其中有状态目录或你的主目录")
    if _inside(real, _real(state_dir)) and not _inside(real, _real(removal.run_dir)):
        return Text("it is in the state folder, outside the run's own folder", "它在状态目录中，不在该运行自己的目录里")
    if removal.cwd and _inside(_real(removal.cwd), real):
        return Text("it holds the run's working folder", "其中有该运行的工作目录")
    # A folder the user named may hold more than checkpoints (`--checkpoint-dir data`): what trainguard
    # cannot tell for a checkpoint stays. The run's own folder is trainguard's, given to the job whole.
    outside = not _inside(real, _real(removal.run_dir))
    if outside and (foreign := layouts.foreign_entries(real, removal.layout, removal.checkpoint_glob)):
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        shown_zh = "、".join(foreign[:3]) + (f" 等 {len(foreign)} 项" if len(foreign) > 3 else "")
        return Text(f"it holds what is not a checkpoint ({shown}): remove the checkpoints in it yourself",
                    f"其中有不是检查点的内容（{shown_zh}）：请自行删除其中的检查点")  # fmt: skip
    for other in others:
        recorded = other.options.get("checkpoint_dir")
        if recorded and (_inside(real, _real(recorded)) or _inside(_real(recorded), real)):
            return Text(f"run {other.id} records it too", f"运行 {other.id} 也记录了它")
        if _inside(_real(other.cwd), real):
            return Text(f"it holds the working folder of run {other.id}", f"其中有运行 {other.id} 的工作目录")
    return None


def _plan(removal: Removal, folder: Path | None, others: list[Run], state_dir: Path, checkpoints: bool) -> Removal:
    run_dir = removal.run_dir
    if folder is not None and (folder.exists() or folder.is_symlink()):
        why = _must_stay(folder, removal, others, state_dir) if checkpoints else None
        if checkpoints and why is None:
            removal.checkpoint_dir = folder
            removal.checkpoint_bytes = disk_usage(folder)
        else:
            removal.kept, removal.kept_why = folder, why
            removal.keep_all = _real(folder) == _real(run_dir)  # checkpoints among the logs: all stays
            if not removal.keep_all and _inside(folder, run_dir):
                removal.keep_entry = folder.relative_to(run_dir).parts[0]
    if removal.keep_all:
        removal.files_bytes = 0
    elif removal.keep_entry is not None:
        removal.files_bytes = disk_usage(run_dir, skip=(removal.keep_entry, NOTE))
    elif run_dir.is_dir():
        inner = removal.checkpoint_dir is not None and _inside(removal.checkpoint_dir, run_dir)
        removal.files_bytes = disk_usage(run_dir) - (removal.checkpoint_bytes if inner else 0)
    return removal


def plan_run(run: Run, others: list[Run], state_dir: Path, *, checkpoints: bool) -> Removal:
    """What removing the recorded ``run`` takes; ``others``: the runs that stay recorded."""
    recorded = run.options.get("checkpoint_dir")
    removal = Removal(run.id, run.name, Path(run.run_dir), cwd=run.cwd,
                      layout=str(run.options.get("checkpoint_layout") or "auto"),
                      checkpoint_glob=run.options.get("checkpoint_glob") or None)  # fmt: skip
    return _plan(removal, Path(recorded) if recorded else None, others, state_dir, checkpoints)


def plan_leftover(folder: Path, others: list[Run], state_dir: Path, *, checkpoints: bool) -> Removal:
    """What finishing the removal that left ``folder`` (no record names it) takes: what its note says,
    else its files, its checkpoints only when asked."""
    note = load_object(str(folder / NOTE)) or {}
    recorded, name, cwd = (note.get(key) for key in ("checkpoint_dir", "name", "cwd"))
    removal = Removal(folder.name, name if isinstance(name, str) else None, folder, leftover=True,
                      cwd=cwd if isinstance(cwd, str) else None)  # fmt: skip
    checkpoints = checkpoints or note.get("remove_checkpoints") is True
    where = Path(recorded) if isinstance(recorded, str) and recorded else folder / DEFAULT_CHECKPOINTS
    return _plan(removal, where, others, state_dir, checkpoints)


def hold(run_dir: Path, run_id: str, patience_s: float = FINISHING_S) -> run_lock.SupervisorLock | None:
    """The run's supervisor lock, taken for its removal (None: its folder is gone, so nobody holds
    it); :class:`RunInUse` when its supervisor keeps it longer than ``patience_s``."""
    if not run_dir.is_dir():
        return None
    try:
        return run_lock.SupervisorLock.acquire(run_dir, run_id, patience_s=patience_s)
    except run_lock.AlreadyWatched as exc:
        raise RunInUse(exc.holder.pid if exc.holder else None) from None
    except FileNotFoundError:  # removed meanwhile
        return None


def check_not_held(run_dir: Path) -> None:
    """:class:`RunInUse` when a supervisor holds the run (what a dry run checks, taking nothing)."""
    held = run_lock.holder(run_dir)
    if held is not None:
        raise RunInUse(held.pid or None)


def remove_run(registry: Registry, removal: Removal) -> list[str]:
    """Remove a recorded run whose lock the caller holds. Returns what could not be removed (left for
    `prune`); :class:`RunInUse` when the run is active again, and then nothing is removed."""
    note_path = removal.run_dir / NOTE
    note = {"run": removal.run_id, "name": removal.name, "time": time.time(), "cwd": removal.cwd,
            "checkpoint_dir": str(removal.checkpoint_dir or removal.kept or "") or None,
            "remove_checkpoints": removal.checkpoint_dir is not None}  # fmt: skip
    # Without its note (a full disk: when people remove runs), a cut-short removal's leftovers keep
    # their checkpoints until asked, and one elsewhere stays: the safe way round.
    with contextlib.suppress(OSError):
        fd = os.open(note_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(note, out)
    if not registry.forget_ended_run(removal.run_id):
        with contextlib.suppress(FileNotFoundError):
            note_path.unlink()
        raise RunInUse()
    return remove_files(removal)


def remove_files(removal: Removal) -> list[str]:
    """Remove the files of a run whose record is gone (or never was): its checkpoint folder where
    planned, then its folder, the note last; kept checkpoints stay with the note. Returns what could
    not be removed."""
    failed: list[str] = []
    if removal.checkpoint_dir is not None:
        _remove_tree(removal.checkpoint_dir, failed)
    if removal.keep_all:
        return failed
    if removal.keep_entry is None:
        _remove_tree(removal.run_dir, failed, last=NOTE)
        return failed
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(removal.run_dir):
            if entry.name not in (removal.keep_entry, NOTE):
                _remove_tree(Path(entry.path), failed)
    return failed


def _remove_tree(path: Path, failed: list[str], last: str | None = None) -> None:
    """Remove ``path`` and all below it, never following a symlink (it is removed itself); each
    failure is added to ``failed``; ``last``: an entry of ``path`` removed after all the others."""

    def attempt(action, target: str) -> None:
        try:
            action(target)
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed.append(f"{target}: {exc.strerror or exc}")

    if path.is_symlink() or not path.is_dir():
        attempt(os.unlink, str(path))
        return
    for folder, dirs, files in os.walk(path, topdown=False):
        for name in files:
            if not (last and folder == str(path) and name == last):
                attempt(os.unlink, os.path.join(folder, name))
        for name in dirs:
            target = os.path.join(folder, name)
            attempt(os.unlink if os.path.islink(target) else os.rmdir, target)
    if last:
        attempt(os.unlink, str(path / last))
    attempt(os.rmdir, str(path))
