"""The checkpoint layout rules, on listings of real folders written by the frameworks' own saving code
(tests/data/layouts, recorded by tools/record_layouts.py), cut the ways kills and power losses cut
them; and the adapter on real files cut on disk."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import struct
from pathlib import Path

import pytest

from trainguard.checkpoint import layouts
from trainguard.checkpoint._files import peek_pickle
from trainguard.checkpoint.layouts import Entry, detect_layout, judge

DATA = Path(__file__).resolve().parents[1] / "data" / "layouts"
ROOT = "/ckpt"


def recorded(name: str) -> list[Entry]:
    rows = json.loads((DATA / f"{name}.json").read_text())["entries"]
    return [Entry(r["path"], r["is_dir"], r["size"], r["mtime"], r["facts"]) for r in rows]


def without(entries: list[Entry], *paths: str) -> list[Entry]:
    return [e for e in entries if e.path not in paths]


def changed(entries: list[Entry], path: str, **fields) -> list[Entry]:
    assert any(e.path == path for e in entries), path
    return [dataclasses.replace(e, **fields) if e.path == path else e for e in entries]


def newest(entries: list[Entry], layout: str = "auto") -> layouts.Checkpoint | None:
    return next((c for c in judge(ROOT, entries, layout) if c.complete), None)


def by_name(entries: list[Entry], layout: str = "auto") -> dict[str, layouts.Checkpoint]:
    return {os.path.relpath(c.path, ROOT): c for c in judge(ROOT, entries, layout)}


@pytest.mark.parametrize(
    ("name", "layout"),
    [
        ("hf_trainer", "hf"),
        ("lightning_modelcheckpoint", "lightning"),
        ("accelerate_save_state", "accelerate"),
        ("deepspeed_stage0_1rank", "deepspeed"),
        ("deepspeed_zero2_2ranks", "deepspeed"),
        ("deepspeed_zero3_2ranks", "deepspeed"),
    ],
)
def test_each_recorded_folder_is_detected_and_all_its_checkpoints_are_complete(name: str, layout: str) -> None:
    entries = recorded(name)
    assert detect_layout(entries) == layout
    found = judge(ROOT, entries)
    assert found and all(c.complete and c.layout == layout for c in found), [c.describe() for c in found]


# ---------------------------------------------------------------------------------------------- hf
def test_hf_newest_complete_is_the_highest_step() -> None:
    best = newest(recorded("hf_trainer"))
    assert best is not None and best.path == f"{ROOT}/checkpoint-6" and best.step == 6


def test_hf_a_folder_cut_before_trainer_state_is_skipped_for_the_previous_one() -> None:
    # transformers' own get_last_checkpoint() would take checkpoint-6 here (issues 35525, 35782).
    entries = without(recorded("hf_trainer"), "checkpoint-6/trainer_state.json", "checkpoint-6/rng_state.pth")
    found = by_name(entries)
    assert not found["checkpoint-6"].complete
    assert "no trainer_state.json" in found["checkpoint-6"].problems[0]
    assert newest(entries).path == f"{ROOT}/checkpoint-3"


@pytest.mark.parametrize(
    ("path", "fields", "reason"),
    [
        ("checkpoint-6/optimizer.pt", {"size": 0}, "optimizer.pt is empty"),
        (
            "checkpoint-6/optimizer.pt",
            {"facts": {"format": "zip", "problem": "not a complete archive"}},
            "optimizer.pt",
        ),
        ("checkpoint-6/model.safetensors", {"facts": {"format": "safetensors", "problem": "cut short"}}, "cut short"),
        ("checkpoint-6/trainer_state.json", {"facts": {"format": "json", "problem": "unreadable JSON"}}, "JSON"),
        ("checkpoint-6/scheduler.pt", {"size": 0}, "scheduler.pt is empty"),
    ],
)
def test_hf_a_damaged_file_makes_the_checkpoint_incomplete(path: str, fields: dict, reason: str) -> None:
    entries = changed(recorded("hf_trainer"), path, **fields)
    assert any(reason in p for p in by_name(entries)["checkpoint-6"].problems)
    assert newest(entries).step == 3


def test_hf_no_weights_at_all_is_incomplete() -> None:
    entries = without(recorded("hf_trainer"), "checkpoint-6/model.safetensors")
    assert "no model weights" in " ".join(by_name(entries)["checkpoint-6"].problems)


def _sharded_checkpoint() -> list[Entry]:
    """checkpoint-9: the weights as save_pretrained shards them, beside a Trainer's other files."""
    entries = recorded("hf_trainer")
    moved = [dataclasses.replace(e, path=e.path.replace("sharded", "checkpoint-9")) for e in entries if
             e.path.startswith("sharded")]  # fmt: skip
    extra = [dataclasses.replace(e, path=e.path.replace("checkpoint-6/", "checkpoint-9/")) for e in entries
             if e.path.startswith("checkpoint-6/") and not e.name.startswith("model")]  # fmt: skip
    return [e for e in entries if not e.path.startswith("sharded")] + moved + extra


def test_hf_every_shard_named_by_the_index_must_be_there() -> None:
    entries = _sharded_checkpoint()
    assert newest(entries).step == 9
    cut = without(entries, "checkpoint-9/model-00003-of-00004.safetensors")
    assert by_name(cut)["checkpoint-9"].problems == (
        "model-00003-of-00004.safetensors (named by model.safetensors.index.json) is missing",
    )
    assert newest(cut).step == 6
    truncated = changed(entries, "checkpoint-9/model-00004-of-00004.safetensors", size=0)
    assert not by_name(truncated)["checkpoint-9"].complete


# --------------------------------------------------------------------------------------- lightning
def test_lightning_steps_come_from_the_name_or_from_inside_last_ckpt() -> None:
    found = by_name(recorded("lightning_modelcheckpoint"))
    assert {name: c.step for name, c in found.items()} == {"epoch=0-step=3.ckpt": 3, "epoch=0-step=6.ckpt": 6,
                                                           "last.ckpt": 6}  # fmt: skip


def test_lightning_a_cut_archive_is_never_chosen() -> None:
    entries = recorded("lightning_modelcheckpoint")
    cut = {"format": "zip", "problem": "not a complete archive (File is not a zip file)"}
    entries = changed(entries, "last.ckpt", facts=cut, mtime=9e9)
    entries = changed(entries, "epoch=0-step=6.ckpt", size=0)
    found = by_name(entries)
    assert not found["last.ckpt"].complete and not found["epoch=0-step=6.ckpt"].complete
    assert newest(entries).path == f"{ROOT}/epoch=0-step=3.ckpt"


def test_lightning_a_file_that_is_not_a_torch_archive_is_not_complete() -> None:
    entries = changed(recorded("lightning_modelcheckpoint"), "last.ckpt", facts={"format": "other"})
    assert by_name(entries)["last.ckpt"].problems == ("last.ckpt is not a torch archive",)


def test_lightning_checkpoints_below_lightning_logs_are_found() -> None:
    entries = [dataclasses.replace(e, path=f"lightning_logs/version_1/checkpoints/{e.path}")
               for e in recorded("lightning_modelcheckpoint")]  # fmt: skip
    entries += [Entry("lightning_logs", True), Entry("lightning_logs/version_1", True),
                Entry("lightning_logs/version_1/checkpoints", True)]  # fmt: skip
    assert detect_layout(entries) == "lightning"
    assert newest(entries).step == 6


# --------------------------------------------------------------------------------------- deepspeed
def test_deepspeed_a_rank_without_its_optimizer_states_is_incomplete_and_latest_is_not_trusted() -> None:
    entries = without(recorded("deepspeed_zero2_2ranks"), "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt")
    tag = by_name(entries)["global_step4"]
    assert not tag.complete
    assert "the optimizer states of rank 1" in tag.problems[0]
    assert "`latest` names this tag" in tag.problems[-1]
    assert newest(entries).path == f"{ROOT}/global_step2"


def test_deepspeed_zero_byte_files_after_a_power_loss_are_incomplete() -> None:
    entries = recorded("deepspeed_zero2_2ranks")
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        entries = changed(entries, f"global_step4/{name}", size=0, facts={})
    assert newest(entries).step == 2


def test_deepspeed_the_rank_count_is_read_from_the_model_states() -> None:
    # Rank 1 wrote nothing at all: only the world size recorded in rank 0's model states tells.
    entries = [e for e in recorded("deepspeed_zero2_2ranks") if "rank_1" not in e.path]
    assert not by_name(entries)["global_step4"].complete
    stage3 = without(recorded("deepspeed_zero3_2ranks"), "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt")
    assert by_name(stage3)["global_step4"].problems[0] == "zero_pp_rank_1_mp_rank_00_model_states.pt is missing"


def test_deepspeed_zero_optimizer_states_are_required_before_any_is_written() -> None:
    # Killed after the model states, before the first optimizer file: the model states say ZeRO.
    entries = [e for e in recorded("deepspeed_zero2_2ranks") if not e.path.endswith("optim_states.pt")
               or e.path.startswith("global_step2")]  # fmt: skip
    assert not by_name(entries)["global_step4"].complete
    # Stage 0 keeps the optimizer inside the model states: nothing else is needed.
    assert newest(recorded("deepspeed_stage0_1rank")).step == 4


# -------------------------------------------------------------------------------------- accelerate
def test_accelerate_checkpoint_number_and_completeness() -> None:
    entries = recorded("accelerate_save_state")
    assert newest(entries).path == f"{ROOT}/checkpoints/checkpoint_1" and newest(entries).step == 1
    for missing, reason in (
        ("checkpoints/checkpoint_1/random_states_0.pkl", "no random_states_0.pkl"),
        ("checkpoints/checkpoint_1/optimizer.bin", "no optimizer.bin"),
        ("checkpoints/checkpoint_1/model.safetensors", "no model weights"),
    ):
        cut = without(entries, missing)
        assert any(reason in p for p in by_name(cut)["checkpoints/checkpoint_1"].problems), missing
        assert newest(cut).step == 0


def test_accelerate_save_state_folders_with_any_name_and_the_project_checkpoints_folder() -> None:
    entries = [dataclasses.replace(e, path=e.path.replace("checkpoints/checkpoint_", "run/step_"))
               for e in recorded("accelerate_save_state") if e.path != "checkpoints"]  # fmt: skip
    entries = [dataclasses.replace(e, path=e.path.removeprefix("run/")) for e in entries]
    assert detect_layout(entries) == "accelerate"
    assert newest(entries).path == f"{ROOT}/step_1"


# -------------------------------------------------------------------------------------- trainguard
def test_trainguard_manifest_rules() -> None:
    manifest = {"format": 1, "step": 5, "time": 1700000000.0, "files": {"tensors.bin": {"size": 10, "crc32": 1}}}
    entries = [
        Entry("step-000000000005", True),
        Entry("step-000000000005/tensors.bin", size=10),
        Entry("step-000000000005/manifest.json", size=90, facts={"format": "json", "content": manifest}),
        Entry("step-000000000009", True),
        Entry("step-000000000009/tensors.bin", size=4),
        Entry(".tmp-step-000000000012-4242", True),
    ]
    assert detect_layout(entries) == "trainguard"
    found = by_name(entries)
    assert found["step-000000000005"].complete and found["step-000000000005"].time == 1700000000.0
    assert found["step-000000000009"].problems == ("no manifest.json (the save did not finish)",)
    assert found[".tmp-step-000000000012-4242"].step == 12 and not found[".tmp-step-000000000012-4242"].complete
    short = changed(entries, "step-000000000005/tensors.bin", size=7)
    assert by_name(short)["step-000000000005"].problems == ("tensors.bin: 7 bytes, manifest.json says 10",)


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(layouts.LayoutError):
        judge(ROOT, [], "keras")


# ------------------------------------------------------------------------------- adapter, real files
def test_scan_reads_real_files_cut_on_disk(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    good = tmp_path / "checkpoint-2"
    good.mkdir()
    torch.save({"w": torch.ones(1000)}, good / "optimizer.pt")
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    (good / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4000))
    (good / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    cut = tmp_path / "checkpoint-4"
    cut.mkdir()
    data = (good / "optimizer.pt").read_bytes()
    (cut / "optimizer.pt").write_bytes(data[: len(data) // 2])
    (cut / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:3000])
    (cut / "trainer_state.json").write_text('{"global_step": 4, "log_hi')
    found = {Path(c.path).name: c for c in layouts.scan(tmp_path)}
    assert found["checkpoint-2"].complete and found["checkpoint-2"].step == 2
    problems = " | ".join(found["checkpoint-4"].problems)
    assert "unreadable JSON" in problems and "cut short" in problems and "not a complete archive" in problems
    assert layouts.newest_complete(tmp_path).path == str(good)
    assert cut.exists() and (cut / "optimizer.pt").exists()  # reported, never deleted


def test_a_checkpointer_folder_is_read_the_same_way(tmp_path: Path) -> None:
    from trainguard import Checkpointer

    with Checkpointer(tmp_path, handle_signals=False, asynchronous=False) as ckpt:
        ckpt.save({"step": 3}, 3)
        ckpt.save({"step": 7}, 7)
    (tmp_path / "step-000000000007" / "manifest.json").unlink()
    best = layouts.newest_complete(tmp_path)
    assert best is not None and best.step == 3 and best.layout == "trainguard"


def test_peeking_into_a_pickle_runs_nothing_from_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    found = peek_pickle(pickle.dumps({"global_step": 12, "payload": Evil()}))
    assert found == {"global_step": 12, "payload": "<object>"}
    assert not marker.exists()


def test_trainguard_a_step_of_several_ranks_is_complete_with_its_job_file_and_every_shard() -> None:
    def shard(step: str, rank: int, size: int = 64) -> list[Entry]:
        folder = f"{step}/rank-{rank:05d}"
        manifest = {
            "format": 1,
            "step": int(step[5:]),
            "time": 1.0,
            "rank": rank,
            "world_size": 2,
            "files": {"tensors.bin": {"size": size, "crc32": 1}, "tree.pkl": {"size": 10, "crc32": 2}},
        }
        return [
            Entry(folder, is_dir=True),
            Entry(f"{folder}/tensors.bin", size=size),
            Entry(f"{folder}/tree.pkl", size=10),
            Entry(f"{folder}/manifest.json", size=200, facts={"content": manifest}),
        ]

    job = {"format": 1, "step": 7, "world_size": 2, "time": 2.0, "shards": {}}
    complete = [
        Entry("step-000000000007", is_dir=True),
        *shard("step-000000000007", 0),
        *shard("step-000000000007", 1),
        Entry("step-000000000007/job.json", size=100, facts={"content": job}),
    ]
    unfinished = [Entry("step-000000000009", is_dir=True), *shard("step-000000000009", 1)]
    found = by_name(complete + unfinished)
    assert found["step-000000000007"].complete and found["step-000000000007"].time == 2.0
    assert not found["step-000000000009"].complete
    assert "not every rank finished this save (1 shard(s) in place)" in found["step-000000000009"].problems[0]
    assert newest(complete + unfinished).step == 7
    cut = changed(complete, "step-000000000007/rank-00001/tensors.bin", size=3)
    assert by_name(cut)["step-000000000007"].problems == ("rank-00001/tensors.bin: 3 bytes, manifest.json says 64",)
    gone = without(
        complete,
        "step-000000000007/rank-00000",
        "step-000000000007/rank-00000/tensors.bin",
        "step-000000000007/rank-00000/tree.pkl",
        "step-000000000007/rank-00000/manifest.json",
    )
    assert by_name(gone)["step-000000000007"].problems == ("the shard of rank 0 (rank-00000) is missing",)
