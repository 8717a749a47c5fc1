"""What the exporter says about a run's checkpoints and its end, read from real checkpoint folders
(written by the Checkpointer, or files a framework saves) and a real registry: the age of the
newest checkpoint, the typical gap between recent ones (what TrainguardCheckpointStale compares the
age with), when an ended run ended (what TrainguardRunFailed uses to stop paging), and no goodput
for a job that reports neither steps nor checkpoints."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainguard import Checkpointer
from trainguard.checkpoint.resume import checkpoint_times
from trainguard.monitor.exporter import TrainguardCollector, typical_gap
from trainguard.store.registry import Attempt, Registry


def test_the_typical_gap_is_the_median_so_one_pause_does_not_stretch_it() -> None:
    assert typical_gap([]) is None and typical_gap([100.0]) is None
    assert typical_gap([0.0, 600.0]) == 600.0
    # saved every 10 minutes, with a 2-hour outage (a crash, a queue) in between, in any order
    assert typical_gap([7200.0 + 1200, 0.0, 600.0, 1200.0, 7200.0 + 600, 7200.0]) == 600.0


def _age(path: Path, seconds_ago: float, now: float | None = None) -> None:
    """Make a checkpoint look written ``seconds_ago`` (before ``now``): a file's modification time, or
    for a Checkpointer folder the time its manifest records (what the checkpoint reader trusts)."""
    when = (time.time() if now is None else now) - seconds_ago
    manifest = path / "manifest.json"
    if manifest.exists():
        record = json.loads(manifest.read_text())
        record["time"] = when
        manifest.write_text(json.dumps(record))
    os.utime(path, (when, when))


def test_checkpoint_times_of_checkpointer_folders_newest_first(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    ckpt = Checkpointer(folder, every=None, every_steps=1, keep=5, handle_signals=False)
    for step in range(4):
        ckpt.save({"step": step}, step)
        ckpt.wait()
    ckpt.close()  # the writer prunes after each save; a manifest rewritten under it reads as damaged
    (folder / "step-000000000009").mkdir()  # renamed but its manifest never written: not complete
    saved = sorted(p for p in folder.iterdir() if (p / "manifest.json").exists())
    assert len(saved) == 4
    now = time.time()
    for index, path in enumerate(saved):  # as if saved every 10 minutes, the newest 5 minutes ago
        _age(path, 300 + 600 * (len(saved) - 1 - index), now)
    times = checkpoint_times(str(folder), None)
    assert len(times) == 4 and times == sorted(times, reverse=True)
    assert time.time() - times[0] == pytest.approx(300, abs=5)
    assert typical_gap(times) == pytest.approx(600)
    assert checkpoint_times(str(tmp_path / "missing"), None) == []


def test_checkpoint_times_of_files_a_framework_saves(tmp_path: Path) -> None:
    for name, size, ago in [("epoch1.pt", 10, 3000), ("epoch2.pt", 10, 2000), ("epoch3.pt", 10, 1000),
                            ("epoch4.pt", 0, 10), ("notes.txt", 10, 5)]:  # fmt: skip
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        _age(path, ago)
    times = checkpoint_times(str(tmp_path), "*.pt")  # an empty file is a save still starting
    assert [round(time.time() - t, -1) for t in times] == [1000, 2000, 3000]


def scraped(registry: Registry) -> dict[tuple[str, str | None], float]:
    """What a scrape of the exporter serves: each sample's value by its name and its run's name."""
    served = CollectorRegistry(auto_describe=False)
    served.register(TrainguardCollector(registry, xid_counts=None))
    return {(s.name, s.labels.get("name")): s.value
            for family in text_string_to_metric_families(generate_latest(served).decode()) for s in family.samples}  # fmt: skip


def test_the_exporter_serves_checkpoint_age_interval_and_the_end_of_an_ended_run(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "state")
    live_dir, ended_dir = tmp_path / "live", tmp_path / "ended"
    for folder in (live_dir, ended_dir):
        folder.mkdir()
        for ago in (2400, 1200, 0):
            (folder / f"model-{ago}.pt").write_bytes(b"weights")
            _age(folder / f"model-{ago}.pt", ago + 60)
    live = registry.create_run(
        ["train"], name="live", cwd="/", options={"checkpoint_dir": str(live_dir), "checkpoint_glob": "*.pt"}
    )
    registry.set_state(live.id, "running")
    registry.start_attempt(live.id, Attempt(n=1, started_at=time.time() - 3000, pid=1))
    ended = registry.create_run(
        ["train"], name="ended", cwd="/", options={"checkpoint_dir": str(ended_dir), "checkpoint_glob": "*.pt"}
    )
    registry.start_attempt(ended.id, Attempt(n=1, started_at=time.time() - 3000, pid=2))
    registry.end_attempt(
        ended.id,
        Attempt(n=1, started_at=time.time() - 3000, ended_at=1_700_000_000.5, exit_code=1, cause="python_error"),
    )
    registry.set_state(ended.id, "failed")

    samples = scraped(registry)
    assert samples[("trainguard_run_last_checkpoint_age_seconds", "live")] == pytest.approx(60, abs=5)
    assert samples[("trainguard_run_checkpoint_interval_seconds", "live")] == pytest.approx(1200, abs=1)
    assert samples[("trainguard_run_end_time_seconds", "ended")] == 1_700_000_000.5
    assert ("trainguard_run_end_time_seconds", "live") not in samples


def test_the_exporter_serves_no_goodput_for_a_job_that_reports_nothing(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "state")
    now = time.time()
    for name, progress in (("silent", None), ("steps", {"first_step": 0, "first_step_time": now - 99,
                                                         "step": 98, "step_time": now - 1})):  # fmt: skip
        run = registry.create_run(["train"], name=name, cwd="/", options={})
        registry.start_attempt(run.id, Attempt(n=1, started_at=now - 100, pid=1))
        registry.end_attempt(run.id, Attempt(n=1, started_at=now - 100, ended_at=now, exit_code=0, progress=progress))
        registry.set_state(run.id, "succeeded")
    samples = scraped(registry)
    assert samples[("trainguard_run_goodput_ratio", "steps")] == pytest.approx(0.98, abs=0.01)
    assert samples[("trainguard_run_training_kept_seconds", "steps")] == pytest.approx(98, abs=1)
    # Nothing says how much of its time trained: no ratio, no kept time, only its wall time.
    assert ("trainguard_run_goodput_ratio", "silent") not in samples
    assert ("trainguard_run_training_kept_seconds", "silent") not in samples
    assert samples[("trainguard_run_wall_seconds", "silent")] == pytest.approx(100, abs=1)
