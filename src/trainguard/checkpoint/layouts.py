"""The one reader of checkpoint folders: which checkpoints a folder holds, their step, and which are
COMPLETE, for every layout trainguard knows. The supervisor resumes from ``newest_complete``; doctor,
the report and the exporter read checkpoints through here too.

Layouts (each learnt from the framework's own saving code, named in its rule below):

- ``trainguard``: ``step-N/`` folders of ``Checkpointer``; complete when ``manifest.json`` (written
  last) names step N and every file it lists has its size. A job of several ranks saves one shard
  per rank, ``step-N/rank-R/`` (each like the above), and ``step-N/job.json`` once every shard is in
  place: complete when ``job.json`` reads and every shard it counts is whole.
- ``hf``: Hugging Face ``Trainer``'s ``checkpoint-N/`` (``Trainer._save_checkpoint``); complete when
  ``trainer_state.json`` (written last) reads, the weights are whole (every shard an index names, or
  the single weights file, or an inner DeepSpeed / FSDP checkpoint) and so is every optimizer,
  scheduler, scaler and RNG file present.
- ``lightning``: ``*.ckpt`` files anywhere below (``lightning_logs/version_*/checkpoints`` too);
  complete when the file is a torch archive whose central directory reads (written last).
- ``deepspeed``: tag folders (``global_stepN/``) of ``engine.save_checkpoint``; complete when the
  model states and, under ZeRO, the optimizer states of every rank (the count is read from the
  model states) are whole. The ``latest`` file is trusted only when the tag it names is complete.
- ``accelerate``: ``checkpoints/checkpoint_N/`` (automatic naming) and any ``save_state`` folder;
  complete when the model and optimizer files, every rank's ``random_states_R.pkl`` (written after
  them) and the registered objects' files are whole. N is the save number, not the training step.

Incomplete checkpoints are listed with the reasons, never chosen, never deleted.

The rules are pure functions of a listing (``Entry`` rows: names, sizes, what ``_files`` read from
inside, see ``_layout_tree``), trainguard's own in ``_layout_trainguard``, the frameworks' in
``_layout_frameworks``; here ``judge`` picks the rule, and ``scan`` and ``newest_complete`` are the
adapter that reads the disk.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable

from trainguard.checkpoint._files import FactsCache
from trainguard.checkpoint._folder_claim import CLAIM_NAME
from trainguard.checkpoint._format import DAMAGED_NAME, LOCK_FILE, TMP_NAME
from trainguard.checkpoint._layout_frameworks import (
    ACC_NAME,
    DS_MODEL,
    HF_NAME,
    RANDOM_STATES,
    accelerate_rule,
    deepspeed_rule,
    hf_rule,
    lightning_rule,
)
from trainguard.checkpoint._layout_trainguard import TG_NAME, TG_TMP, trainguard_rule
from trainguard.checkpoint._layout_tree import Checkpoint, Entry, Tree
from trainguard.checkpoint.adaptive import STATE_FILE as ADAPTIVE_STATE_FILE

LAYOUTS = ("auto", "trainguard", "hf", "lightning", "deepspeed", "accelerate")
MAX_DEPTH = 6
MAX_ENTRIES = 50_000


class LayoutError(ValueError):
    pass


def detect_layout(entries: Iterable[Entry]) -> str | None:
    """Which layout a folder's listing holds (the first that matches, in the order below), or None."""
    tree = Tree(entries)
    top = tree.children.get("", [])
    names = {e.name for e in top}
    if any(TG_NAME.match(n) or TG_TMP.match(n) for n in names):
        return "trainguard"
    if any(e.is_dir and HF_NAME.match(e.name) for e in top):
        return "hf"
    if any(e.is_dir and ACC_NAME.match(e.name) for e in top) or any(
        e.is_dir and ACC_NAME.match(e.name) for e in tree.dirs("checkpoints")
    ):
        return "accelerate"
    if "latest" in names or any(DS_MODEL.match(f) for d in tree.dirs("") for f in tree.files(d.path)):
        return "deepspeed"
    if any(not e.is_dir and e.name.endswith(".ckpt") for e in tree.by_path.values()):
        return "lightning"
    if any(any(RANDOM_STATES.match(f) for f in tree.files(d.path)) for d in tree.dirs("")):
        return "accelerate"
    return None


def judge(root: str, entries: Iterable[Entry], layout: str = "auto") -> list[Checkpoint]:
    """Every checkpoint in the listing of ``root``, complete or not, newest first."""
    if layout not in LAYOUTS:
        raise LayoutError(f"unknown checkpoint layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    entries = list(entries)
    if layout == "auto":
        layout = detect_layout(entries) or "trainguard"
    tree = Tree(entries)
    found = _RULES[layout](root, tree)
    return sorted(found, key=lambda c: (c.step if c.step is not None else -1, c.time), reverse=True)


_RULES = {
    "trainguard": trainguard_rule,
    "hf": hf_rule,
    "lightning": lightning_rule,
    "deepspeed": deepspeed_rule,
    "accelerate": accelerate_rule,
}


# ---------------------------------------------------------------------------------------------- disk
_CACHE = FactsCache()
_PEEKED = re.compile(r"\.ckpt$|model_states\.pt$")  # step (Lightning) and rank count (DeepSpeed) live inside


def listing(folder: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH) -> list[Entry]:
    """The entries below ``folder`` (at most ``max_depth`` levels and ``MAX_ENTRIES`` entries), each
    file with what ``_files`` reads from inside it. Files that vanish while being listed are left out."""
    root = os.fspath(folder)
    entries: list[Entry] = []
    pending = [("", 0)]
    while pending and len(entries) < MAX_ENTRIES:
        relative, depth = pending.pop()
        try:
            with os.scandir(os.path.join(root, relative) if relative else root) as iterator:
                items = list(iterator)
        except OSError:
            continue
        for item in items:
            path = f"{relative}/{item.name}" if relative else item.name
            try:
                stat = item.stat(follow_symlinks=True)
            except OSError:
                continue
            if item.is_dir(follow_symlinks=True):
                entries.append(Entry(path, is_dir=True, mtime=stat.st_mtime))
                if depth + 1 < max_depth:
                    pending.append((path, depth + 1))
            else:
                facts = _CACHE.get(item.path, item.name, stat, bool(_PEEKED.search(item.name)))
                entries.append(Entry(path, size=stat.st_size, mtime=stat.st_mtime, facts=facts))
    return entries


def scan(folder: str | os.PathLike[str], layout: str = "auto") -> list[Checkpoint]:
    """Every checkpoint in ``folder``, complete or not, newest first (empty when there is no folder)."""
    if layout not in LAYOUTS:
        raise LayoutError(f"unknown checkpoint layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    root = os.path.abspath(os.fspath(folder))
    if not os.path.isdir(root):
        return []
    return judge(root, listing(root), layout)


def newest_complete(folder: str | os.PathLike[str], layout: str = "auto") -> Checkpoint | None:
    """The checkpoint to resume from: the newest complete one, or None."""
    return next((c for c in scan(folder, layout) if c.complete), None)


# What trainguard's Checkpointer keeps beside its step folders: the writer's lock, a save in flight,
# a damaged save set aside, the claim of the run writing there, the adaptive batch's state; and
# DeepSpeed's pointer to its newest tag.
_BOOKKEEPING_FILES = {LOCK_FILE, ADAPTIVE_STATE_FILE, "latest"}
_BOOKKEEPING_NAMES = (TMP_NAME, DAMAGED_NAME, CLAIM_NAME)


def _bookkeeping(name: str) -> bool:
    return name in _BOOKKEEPING_FILES or any(pattern.match(name) for pattern in _BOOKKEEPING_NAMES)


def foreign_entries(
    folder: str | os.PathLike[str], layout: str = "auto", checkpoint_glob: str | None = None
) -> list[str]:
    """The names at the top of ``folder`` that are neither a checkpoint its layout finds, nor a file
    ``checkpoint_glob`` matches (run --checkpoint-glob: a format of the job's own), nor the folder one
    of those lies in, nor a checkpointer's bookkeeping: what a person or another program put there,
    which removing "the checkpoints" must not take."""
    root = os.path.abspath(os.fspath(folder))
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = [c.path for c in scan(root, layout)]
    if checkpoint_glob:
        found += glob.glob(checkpoint_glob if os.path.isabs(checkpoint_glob) else os.path.join(root, checkpoint_glob))
    held = {os.path.relpath(path, root).split(os.sep)[0] for path in found}
    return [name for name in names if name not in held and not _bookkeeping(name)]
