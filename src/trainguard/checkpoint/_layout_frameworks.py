"""The rules of the frameworks' layouts, each learnt from the framework's own saving code: Hugging Face
``Trainer``, Lightning, DeepSpeed and Accelerate (what each counts as complete: ``layouts``). The
weights of hf and accelerate are judged alike, an inner DeepSpeed checkpoint by DeepSpeed's rule."""

from __future__ import annotations

import os
import re

from trainguard.checkpoint._layout_tree import Checkpoint, Entry, Tree, folder_checkpoint, problems_of, whole

HF_NAME = re.compile(r"^checkpoint-([0-9]+)$")  # transformers' trainer_utils._re_checkpoint
ACC_NAME = re.compile(r"^checkpoint_([0-9]+)$")
_LAST_NUMBER = re.compile(r"([0-9]+)(?=[^/]*$)")  # accelerate's own sort key for checkpoint folders
_STEP_IN_NAME = re.compile(r"(?:^|[^a-z])step=?([0-9]+)")
_DS_TAG_STEP = re.compile(r"^global_step([0-9]+)$")
DS_MODEL = re.compile(r"^(?:(?:bf16_)?zero_pp_rank_([0-9]+)_)?mp_rank_([0-9]+)_model_states\.pt$")
_DS_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt$")
_DS_EXPERT = re.compile(r"^(?:layer_[0-9]+_)?expert_[0-9]+_mp_rank_[0-9]+_model_states\.pt$|^expp_rank_")
RANDOM_STATES = re.compile(r"^random_states_([0-9]+)\.pkl$")
_CUSTOM = re.compile(r"^custom_checkpoint_([0-9]+)\.pkl$")
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
_HF_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_ACC_WEIGHTS = re.compile(r"^(?:model|pytorch_model)(?:_[0-9]+)?\.(?:safetensors|bin)$")
_ACC_OPTIM = re.compile(r"^optimizer(?:_[0-9]+)?\.bin$")


# weights, shared by hf and accelerate ----------------------------------------------------------------
def _inner_engine(tree: Tree, folder: str) -> tuple[bool, list[str]]:
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
        return True, problems_of(e for e in tree.below(folder) if not e.is_dir and "fsdp" in e.path)
    return False, []


def _sharded(tree: Tree, folder: str, index: Entry) -> list[str]:
    content = index.facts.get("content")
    if index.facts.get("problem") or not isinstance(content, dict) or not isinstance(content.get("weight_map"), dict):
        return [whole(index) or f"{index.path} has no weight_map"]
    files = tree.files(folder)
    problems = []
    for shard in sorted(set(map(str, content["weight_map"].values()))):
        entry = files.get(shard)
        if entry is None:
            problems.append(f"{shard} (named by {index.name}) is missing")
        elif problem := whole(entry):
            problems.append(problem)
    return problems


# hf ----------------------------------------------------------------------------------------------
def hf_rule(root: str, tree: Tree) -> list[Checkpoint]:
    found = []
    for entry in tree.dirs(""):
        match = HF_NAME.match(entry.name)
        if match:
            found.append(
                folder_checkpoint(root, tree, entry.path, "hf", int(match.group(1)), _hf_problems(tree, entry.path))
            )
    return found


def _hf_problems(tree: Tree, folder: str) -> list[str]:
    files = tree.files(folder)
    problems = []
    state = files.get("trainer_state.json")
    if state is None:
        problems.append("no trainer_state.json (Trainer writes it last: the save did not finish)")
    elif problem := whole(state):
        problems.append(problem)
    index = next((files[n] for n in _HF_INDEXES if n in files), None)
    if index is not None:
        problems += _sharded(tree, folder, index)
    elif weights := [files[n] for n in _HF_WEIGHTS if n in files]:
        problems += problems_of(weights)
    else:
        engine, engine_problems = _inner_engine(tree, folder)
        problems += (
            engine_problems if engine else ["no model weights (model.safetensors, pytorch_model.bin or an index)"]
        )
    others = [e for n, e in files.items() if n.endswith((".pt", ".pth", ".bin")) and n not in _HF_WEIGHTS]
    problems += problems_of(others)
    return problems


# lightning ---------------------------------------------------------------------------------------
def lightning_rule(root: str, tree: Tree) -> list[Checkpoint]:
    found = []
    for entry in tree.by_path.values():
        if entry.is_dir or not entry.name.endswith(".ckpt"):
            continue
        problems = []
        if entry.size == 0 or entry.facts.get("problem"):
            problems.append(whole(entry) or "")
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
def deepspeed_rule(root: str, tree: Tree) -> list[Checkpoint]:
    tags = _deepspeed_tags("", tree)
    latest = tree.files("").get("latest")
    named = latest.facts.get("content") if latest else None
    found = []
    for folder, step, problems in tags:
        warning = ["`latest` names this tag: DeepSpeed's load_checkpoint() would load it"] if named == folder else []
        found.append(folder_checkpoint(root, tree, folder, "deepspeed", step, problems + warning if problems else []))
    return found


def _deepspeed_tags(folder: str, tree: Tree) -> list[tuple[str, int | None, list[str]]]:
    """(tag folder, step, problems) for each folder below ``folder`` holding model states."""
    tags = []
    for entry in tree.dirs(folder):
        files = tree.files(entry.path)
        models = {name: e for name, e in files.items() if DS_MODEL.match(name)}
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
    model_ranks = {(int(m.group(1) or -1), int(m.group(2))) for m in map(DS_MODEL.match, models)}
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
    checked = [e for n, e in files.items() if DS_MODEL.match(n) or _DS_OPTIM.match(n) or _DS_EXPERT.match(n)]
    return problems + problems_of(checked)


# accelerate ----------------------------------------------------------------------------------------
def accelerate_rule(root: str, tree: Tree) -> list[Checkpoint]:
    found = []
    candidates = [e for e in tree.dirs("checkpoints") if ACC_NAME.match(e.name)] + [
        e for e in tree.dirs("") if ACC_NAME.match(e.name) or _looks_saved_by_accelerate(tree, e.path)
    ]
    for entry in candidates:
        number = _LAST_NUMBER.search(entry.name)
        step = int(number.group(1)) if number else None
        found.append(
            folder_checkpoint(root, tree, entry.path, "accelerate", step, _accelerate_problems(tree, entry.path))
        )
    return found


def _looks_saved_by_accelerate(tree: Tree, folder: str) -> bool:
    return any(RANDOM_STATES.match(n) or _ACC_OPTIM.match(n) for n in tree.files(folder))


def _accelerate_problems(tree: Tree, folder: str) -> list[str]:
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
    ranks = sorted(int(m.group(1)) for m in map(RANDOM_STATES.match, files) if m)
    if not ranks:
        problems.append("no random_states_0.pkl (save_state writes it after the model and optimizer)")
    else:
        problems += [f"random_states_{r}.pkl is missing" for r in range(ranks[-1]) if r not in ranks]
    customs = sorted(int(m.group(1)) for m in map(_CUSTOM.match, files) if m)
    problems += (
        [f"custom_checkpoint_{i}.pkl is missing" for i in range(customs[-1]) if i not in customs] if customs else []
    )
    problems += problems_of(e for n, e in files.items() if n.endswith((".bin", ".pkl", ".pt", ".safetensors")))
    return problems
