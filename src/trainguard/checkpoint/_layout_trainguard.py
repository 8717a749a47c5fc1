"""The rule of trainguard's own layout (``Checkpointer``'s ``step-N/`` folders, see ``_format``): a
checkpoint is complete when its manifest names its step and every file it lists has its size; a step
of a job of several ranks when its ``job.json`` reads and every shard it counts is whole."""

from __future__ import annotations

import re

from trainguard.checkpoint._layout_tree import Checkpoint, Tree, folder_checkpoint, whole

TG_NAME = re.compile(r"^step-([0-9]{12,})$")
TG_TMP = re.compile(r"^\.tmp-step-([0-9]+)-[0-9]+$")
_TG_SHARD = re.compile(r"^rank-([0-9]{5,})$")


def trainguard_rule(root: str, tree: Tree) -> list[Checkpoint]:
    found = []
    for entry in tree.dirs(""):
        if tmp := TG_TMP.match(entry.name):
            problems = ["a temporary folder: the save is in progress or was killed"]
            found.append(folder_checkpoint(root, tree, entry.path, "trainguard", int(tmp.group(1)), problems))
            continue
        match = TG_NAME.match(entry.name)
        if not match:
            continue
        step = int(match.group(1))
        files = tree.files(entry.path)
        if "job.json" in files or any(_TG_SHARD.match(d.name) for d in tree.dirs(entry.path)):
            found.append(_trainguard_job(root, tree, entry.path, step))
            continue
        problems, when = _manifest_problems(tree, entry.path, step)
        found.append(folder_checkpoint(root, tree, entry.path, "trainguard", step, problems, when))
    return found


def _manifest_problems(tree: Tree, folder: str, step: int) -> tuple[list[str], float | None]:
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
        problems.append(whole(manifest) or "manifest.json is not an object")
    else:
        if content.get("step") != step:
            problems.append(f"manifest.json says step {content.get('step')}")
        listed = content.get("files") if isinstance(content.get("files"), dict) else {}
        if not listed:
            problems.append("manifest.json lists no files")
        for name, expected in listed.items():
            present = files.get(name)
            size = expected.get("size") if isinstance(expected, dict) else None
            if not isinstance(size, int) or isinstance(size, bool):
                problems.append(f"manifest.json gives no size for {name}"[:300])
            elif present is None:
                problems.append(f"{name} is missing"[:300])
            elif present.size != size:
                problems.append(f"{name}: {present.size} bytes, manifest.json says {size}")
        if isinstance(content.get("time"), (int, float)):
            when = float(content["time"])
    return problems, when


def _trainguard_job(root: str, tree: Tree, folder: str, step: int) -> Checkpoint:
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
        problems.append(whole(job) or "job.json names no world_size")
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
    return folder_checkpoint(root, tree, folder, "trainguard", step, problems, when)
