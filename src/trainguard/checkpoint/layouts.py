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
inside); ``scan`` and ``newest_complete`` are the adapter that reads the disk.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.checkpoint._files import FactsCache

LAYOUTS = ("auto", "trainguard", "hf", "lightning", "deepspeed", "accelerate")
MAX_DEPTH = 6
MAX_ENTRIES = 50_000


@dataclass(frozen=True)
class Entry:
    """One file or folder below the scanned folder. ``path`` is relative, "/"-separated."""

    path: str
    is_dir: bool = False
    size: int = 0
    mtime: float = 0.0
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rsplit("/", 1)[0] if "/" in self.path else ""


@dataclass(frozen=True)
class Checkpoint:
    path: str  # absolute
    layout: str
    step: int | None  # the number its framework gives it (Accelerate: the save number)
    complete: bool
    problems: tuple[str, ...] = ()  # why it is not complete
    time: float = 0.0  # when it was written (the manifest's time, else the newest file's mtime)
    size_bytes: int = 0

    def describe(self) -> str:
        return f"{self.path}: {'; '.join(self.problems)}" if self.problems else self.path


class LayoutError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------- pure
_TG_NAME = re.compile(r"^step-([0-9]{12,})$")
_TG_TMP = re.compile(r"^\.tmp-step-([0-9]+)-[0-9]+$")
_TG_SHARD = re.compile(r"^rank-([0-9]{5,})$")
_HF_NAME = re.compile(r"^checkpoint-([0-9]+)$")  # transformers' trainer_utils._re_checkpoint
_ACC_NAME = re.compile(r"^checkpoint_([0-9]+)$")
_LAST_NUMBER = re.compile(r"([0-9]+)(?=[^/]*$)")  # accelerate's own sort key for checkpoint folders
_STEP_IN_NAME = re.compile(r"(?:^|[^a-z])step=?([0-9]+)")
_DS_TAG_STEP = re.compile(r"^global_step([0-9]+)$")
_DS_MODEL = re.compile(r"^(?:(?:bf16_)?zero_pp_rank_([0-9]+)_)?mp_rank_([0-9]+)_model_states\.pt$")
_DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt$")
_DS_EXPERT = re.compile(r"^(?:layer_[0-9]+_)?expert_[0-9]+_mp_rank_[0-9]+_model_states\.pt$|^expp_rank_")
_RANDOM_STATES = re.compile(r"^random_states_([0-9]+)\.pkl$")
_CUSTOM = re.compile(r"^custom_checkpoint_([0-9]+)\.pkl$")
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
_HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_ACC_WEIGHTS = re.compile(r"^(?:model|pytorch_model)(?:_[0-9]+)?\.(?:safetensors|bin)$")
_ACC_OPTIM = re.compile(r"^optimizer(?:_[0-9]+)?\.bin$")


class _Tree:
    """The listing, indexed by folder."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.by_path: dict[str, Entry] = {}
        self.children: dict[str, list[Entry]] = {}
        for entry in entries:
            self.by_path[entry.path] = entry
            self.children.setdefault(entry.parent, []).append(entry)

    def files(self, folder: str) -> dict[str, Entry]:
        return {e.name: e for e in self.children.get(folder, []) if not e.is_dir}

    def dirs(self, folder: str) -> list[Entry]:
        return [e for e in self.children.get(folder, []) if e.is_dir]

    def below(self, folder: str) -> list[Entry]:
        prefix = f"{folder}/" if folder else ""
        return [e for e in self.by_path.values() if e.path.startswith(prefix)]


def _whole(entry: Entry) -> str | None:
    """Why one file cannot be whole, or None."""
    if entry.size == 0:
        return f"{entry.path} is empty (0 bytes: cut by a kill or a power loss)"
    problem = entry.facts.get("problem")
    return f"{entry.path}: {problem}" if problem else None


def _problems_of(entries: Iterable[Entry]) -> list[str]:
    return [p for p in (_whole(e) for e in entries) if p]


def _newest(tree: _Tree, folder: str) -> float:
    own = tree.by_path[folder].mtime if folder in tree.by_path else 0.0
    return max((e.mtime for e in tree.below(folder) if not e.is_dir), default=own)


def _size(tree: _Tree, folder: str) -> int:
    return sum(e.size for e in tree.below(folder) if not e.is_dir)


def detect_layout(entries: Iterable[Entry]) -> str | None:
    """Which layout a folder's listing holds (the first that matches, in the order below), or None."""
    tree = _Tree(entries)
    top = tree.children.get("", [])
    names = {e.name for e in top}
    if any(_TG_NAME.match(n) or _TG_TMP.match(n) for n in names):
        return "trainguard"
    if any(e.is_dir and _HF_NAME.match(e.name) for e in top):
        return "hf"
    if any(e.is_dir and _ACC_NAME.match(e.name) for e in top) or any(
        e.is_dir and _ACC_NAME.match(e.name) for e in tree.dirs("checkpoints")
    ):
        return "accelerate"
    if "latest" in names or any(_DS_MODEL.match(f) for d in tree.dirs("") for f in tree.files(d.path)):
        return "deepspeed"
    if any(not e.is_dir and e.name.endswith(".ckpt") for e in tree.by_path.values()):
        return "lightning"
    if any(any(_RANDOM_STATES.match(f) for f in tree.files(d.path)) for d in tree.dirs("")):
        return "accelerate"
    return None


def judge(root: str, entries: Iterable[Entry], layout: str = "auto") -> list[Checkpoint]:
    """Every checkpoint in the listing of ``root``, complete or not, newest first."""
    if layout not in LAYOUTS:
        raise LayoutError(f"unknown checkpoint layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    entries = list(entries)
    if layout == "auto":
        layout = detect_layout(entries) or "trainguard"
    tree = _Tree(entries)
    found = _RULES[layout](root, tree)
    return sorted(found, key=lambda c: (c.step if c.step is not None else -1, c.time), reverse=True)


def _checkpoint(root: str, tree: _Tree, folder: str, layout: str, step: int | None, problems: list[str],
                when: float | None = None) -> Checkpoint:  # fmt: skip
    return Checkpoint(
        path=os.path.join(root, folder) if folder else root,
        layout=layout,
        step=step,
        complete=not problems,
        problems=tuple(problems),
        time=when if when is not None else _newest(tree, folder),
        size_bytes=_size(tree, folder),
    )


# trainguard --------------------------------------------------------------------------------------
def _trainguard(root: str, tree: _Tree) -> list[Checkpoint]:
    found = []
    for entry in tree.dirs(""):
        if tmp := _TG_TMP.match(entry.name):
            problems = ["a temporary folder: the save is in progress or was killed"]
            found.append(_checkpoint(root, tree, entry.path, "trainguard", int(tmp.group(1)), problems))
            continue
        match = _TG_NAME.match(entry.name)
        if not match:
            continue
        step = int(match.group(1))
        files = tree.files(entry.path)
        if "job.json" in files or any(_TG_SHARD.match(d.name) for d in tree.dirs(entry.path)):
            found.append(_trainguard_job(root, tree, entry.path, step))
            continue
        problems, when = _manifest_problems(tree, entry.path, step)
        found.append(_checkpoint(root, tree, entry.path, "trainguard", step, problems, when))
    return found


def _manifest_problems(tree: _Tree, folder: str, step: int) -> tuple[list[str], float | None]:
    """Why a folder written by ``Checkpointer`` (a checkpoint, or one rank's shard) is not whole,
    and when its manifest says it was written."""
    files = tree.files(folder)
    manifest = files.get("manifest.json")
    problems: list[str] = []
    when = None
    content = manifest.facts.get("content") if manifest else None
    if manifest is None:
        problems.append("no manifest.json (the save did not finish)")
    elif not isinstance(content, dict) or manifest.facts.get("problem"):
        problems.append(_whole(manifest) or "manifest.json is not an object")
    else:
        if content.get("step") != step:
            problems.append(f"manifest.json says step {content.get('step')}")
        listed = content.get("files") if isinstance(content.get("files"), dict) else {}
        for name, expected in listed.items():
            present = files.get(name)
            size = expected.get("size") if isinstance(expected, dict) else None
            if present is None:
                problems.append(f"{name} is missing")
            elif size is not None and present.size != size:
                problems.append(f"{name}: {present.size} bytes, manifest.json says {size}")
        if isinstance(content.get("time"), (int, float)):
            when = float(content["time"])
    return problems, when


def _trainguard_job(root: str, tree: _Tree, folder: str, step: int) -> Checkpoint:
    """A step of a job of several ranks: complete when ``job.json`` (written once every rank's shard
    was in place) reads, and every shard it counts is whole."""
    job = tree.files(folder).get("job.json")
    content = job.facts.get("content") if job else None
    problems: list[str] = []
    shards = sorted(d.name for d in tree.dirs(folder) if _TG_SHARD.match(d.name))
    when = None
    if job is None:
        problems.append(f"no job.json: not every rank finished this save ({len(shards)} shard(s) in place)")
        world_size = max((int(_TG_SHARD.match(s).group(1)) for s in shards), default=-1) + 1
    elif not isinstance(content, dict) or job.facts.get("problem") or not isinstance(content.get("world_size"), int):
        problems.append(_whole(job) or "job.json names no world_size")
        world_size = 0
    else:
        world_size = content["world_size"]
        if content.get("step") != step:
            problems.append(f"job.json says step {content.get('step')}")
        if isinstance(content.get("time"), (int, float)):
            when = float(content["time"])
    for rank in range(world_size):
        shard = f"{folder}/rank-{rank:05d}"
        if shard not in tree.by_path:
            if job is not None:
                problems.append(f"the shard of rank {rank} (rank-{rank:05d}) is missing")
            continue
        shard_problems, _ = _manifest_problems(tree, shard, step)
        problems += [f"rank-{rank:05d}/{p}" for p in shard_problems]
    return _checkpoint(root, tree, folder, "trainguard", step, problems, when)


# weights, shared by hf and accelerate ----------------------------------------------------------------
def _inner_engine(tree: _Tree, folder: str) -> tuple[bool, list[str]]:
    """A DeepSpeed or FSDP checkpoint inside a framework's folder: (found, its problems)."""
    inner = _deepspeed_tags(folder, tree)
    if inner:
        latest = tree.files(folder).get("latest")
        tag = latest.facts.get("content") if latest else None
        chosen = [c for c in inner if c[0] == f"{folder}/{tag}"] if tag else inner
        if not chosen:
            return True, [f"latest names {tag!r}, which is not there"]
        return True, chosen[0][2]
    fsdp = [e for e in tree.below(folder) if e.name.startswith("pytorch_model_fsdp")]
    if fsdp:
        return True, _problems_of(e for e in tree.below(folder) if not e.is_dir and "fsdp" in e.path)
    return False, []


def _sharded(tree: _Tree, folder: str, index: Entry) -> list[str]:
    content = index.facts.get("content")
    if index.facts.get("problem") or not isinstance(content, dict) or not isinstance(content.get("weight_map"), dict):
        return [_whole(index) or f"{index.path} has no weight_map"]
    files = tree.files(folder)
    problems = []
    for shard in sorted(set(map(str, content["weight_map"].values()))):
        entry = files.get(shard)
        if entry is None:
            problems.append(f"{shard} (named by {index.name}) is missing")
        elif problem := _whole(entry):
            problems.append(problem)
    return problems


# hf ----------------------------------------------------------------------------------------------
def _hf(root: str, tree: _Tree) -> list[Checkpoint]:
    found = []
    for entry in tree.dirs(""):
        match = _HF_NAME.match(entry.name)
        if match:
            found.append(_checkpoint(root, tree, entry.path, "hf", int(match.group(1)), _hf_problems(tree, entry.path)))
    return found


def _hf_problems(tree: _Tree, folder: str) -> list[str]:
    files = tree.files(folder)
    problems = []
    state = files.get("trainer_state.json")
    if state is None:
        problems.append("no trainer_state.json (Trainer writes it last: the save did not finish)")
    elif problem := _whole(state):
        problems.append(problem)
    index = next((files[n] for n in _HF_INDEXES if n in files), None)
    if index is not None:
        problems += _sharded(tree, folder, index)
    elif weights := [files[n] for n in _HF_WEIGHTS if n in files]:
        problems += _problems_of(weights)
    else:
        engine, engine_problems = _inner_engine(tree, folder)
        problems += (
            engine_problems if engine else ["no model weights (model.safetensors, pytorch_model.bin or an index)"]
        )
    others = [e for n, e in files.items() if n.endswith((".pt", ".pth", ".bin")) and n not in _HF_WEIGHTS]
    problems += _problems_of(others)
    return problems


# lightning ---------------------------------------------------------------------------------------
def _lightning(root: str, tree: _Tree) -> list[Checkpoint]:
    found = []
    for entry in tree.by_path.values():
        if entry.is_dir or not entry.name.endswith(".ckpt"):
            continue
        problems = []
        if entry.size == 0 or entry.facts.get("problem"):
            problems.append(_whole(entry) or "")
        elif entry.facts.get("format") not in (None, "zip"):
            problems.append(f"{entry.path} is not a torch archive")
        match = _STEP_IN_NAME.search(entry.name)
        peeked = entry.facts.get("peek") or {}
        step = int(match.group(1)) if match else peeked.get("global_step")
        found.append(
            Checkpoint(
                path=os.path.join(root, entry.path),
                layout="lightning",
                step=step if isinstance(step, int) else None,
                complete=not problems,
                problems=tuple(problems),
                time=entry.mtime,
                size_bytes=entry.size,
            )
        )
    return found


# deepspeed ---------------------------------------------------------------------------------------
def _deepspeed(root: str, tree: _Tree) -> list[Checkpoint]:
    tags = _deepspeed_tags("", tree)
    latest = tree.files("").get("latest")
    named = latest.facts.get("content") if latest else None
    found = []
    for folder, step, problems in tags:
        warning = ["`latest` names this tag: DeepSpeed's load_checkpoint() would load it"] if named == folder else []
        found.append(_checkpoint(root, tree, folder, "deepspeed", step, problems + warning if problems else []))
    return found


def _deepspeed_tags(folder: str, tree: _Tree) -> list[tuple[str, int | None, list[str]]]:
    """(tag folder, step, problems) for each folder below ``folder`` holding model states."""
    tags = []
    for entry in tree.dirs(folder):
        files = tree.files(entry.path)
        models = {name: e for name, e in files.items() if _DS_MODEL.match(name)}
        if not models:
            continue
        tags.append((entry.path, _deepspeed_step(entry.name, models), _deepspeed_problems(files, models)))
    return tags


def _deepspeed_step(tag: str, models: dict[str, Entry]) -> int | None:
    if match := _DS_TAG_STEP.match(tag):
        return int(match.group(1))
    for entry in models.values():
        steps = (entry.facts.get("peek") or {}).get("global_steps")
        if isinstance(steps, int):
            return steps
    return None


def _deepspeed_problems(files: dict[str, Entry], models: dict[str, Entry]) -> list[str]:
    # The world sizes are read from the model states (DeepSpeed's _common_checkpoint_state); without
    # them (an archive in the old format) the highest rank number on disk stands in.
    facts = next((peeked for name in sorted(models) if (peeked := models[name].facts.get("peek"))), {})
    model_ranks = {(int(m.group(1) or -1), int(m.group(2))) for m in map(_DS_MODEL.match, models)}
    optim_ranks = {(int(m.group(1)), int(m.group(2))) for m in map(_DS_OPTIM.match, files) if m}
    ranks = model_ranks | optim_ranks
    stage3 = any(d >= 0 for d, _ in model_ranks)  # ZeRO-3 partitions the model states too
    zero = stage3 or bool(optim_ranks) or facts.get("param_shapes") is not None
    mp = facts.get("mp_world_size") if isinstance(facts.get("mp_world_size"), int) else 1 + max(m for _, m in ranks)
    dp = facts.get("dp_world_size") if isinstance(facts.get("dp_world_size"), int) else 1 + max(d for d, _ in ranks)
    dp = max(dp, 1)
    problems = []
    expected = {(d, m) for d in range(dp) for m in range(mp)} if stage3 else {(-1, m) for m in range(mp)}
    for d, m in sorted(expected - model_ranks):
        prefix = f"zero_pp_rank_{d}_" if d >= 0 else ""
        problems.append(f"{prefix}mp_rank_{m:02d}_model_states.pt is missing")
    if zero:
        for d, m in sorted({(d, m) for d in range(dp) for m in range(mp)} - optim_ranks):
            problems.append(
                f"the optimizer states of rank {d} (zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt) are missing"
            )
    checked = [e for n, e in files.items() if _DS_MODEL.match(n) or _DS_OPTIM.match(n) or _DS_EXPERT.match(n)]
    return problems + _problems_of(checked)


# accelerate ----------------------------------------------------------------------------------------
def _accelerate(root: str, tree: _Tree) -> list[Checkpoint]:
    found = []
    candidates = [e for e in tree.dirs("checkpoints") if _ACC_NAME.match(e.name)] + [
        e for e in tree.dirs("") if _ACC_NAME.match(e.name) or _looks_saved_by_accelerate(tree, e.path)
    ]
    for entry in candidates:
        number = _LAST_NUMBER.search(entry.name)
        step = int(number.group(1)) if number else None
        found.append(_checkpoint(root, tree, entry.path, "accelerate", step, _accelerate_problems(tree, entry.path)))
    return found


def _looks_saved_by_accelerate(tree: _Tree, folder: str) -> bool:
    return any(_RANDOM_STATES.match(n) or _ACC_OPTIM.match(n) for n in tree.files(folder))


def _accelerate_problems(tree: _Tree, folder: str) -> list[str]:
    files = tree.files(folder)
    problems = []
    index = next((files[n] for n in _HF_INDEXES if n in files), None)
    weights = [e for n, e in files.items() if _ACC_WEIGHTS.match(n)]
    engine, engine_problems = (False, []) if weights or index else _inner_engine(tree, folder)
    if index is not None:
        problems += _sharded(tree, folder, index)
    elif not weights and not engine:
        problems.append("no model weights (model.safetensors or pytorch_model.bin)")
    problems += engine_problems
    if not engine and not any(_ACC_OPTIM.match(n) for n in files):
        problems.append("no optimizer.bin (save_state writes it after the model)")
    ranks = sorted(int(m.group(1)) for m in map(_RANDOM_STATES.match, files) if m)
    if not ranks:
        problems.append("no random_states_0.pkl (save_state writes it after the model and optimizer)")
    else:
        problems += [f"random_states_{r}.pkl is missing" for r in range(ranks[-1]) if r not in ranks]
    customs = sorted(int(m.group(1)) for m in map(_CUSTOM.match, files) if m)
    problems += (
        [f"custom_checkpoint_{i}.pkl is missing" for i in range(customs[-1]) if i not in customs] if customs else []
    )
    problems += _problems_of(e for n, e in files.items() if n.endswith((".bin", ".pkl", ".pt", ".safetensors")))
    return problems


_RULES = {
    "trainguard": _trainguard,
    "hf": _hf,
    "lightning": _lightning,
    "deepspeed": _deepspeed,
    "accelerate": _accelerate,
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
