"""Checkpoint manifests and job files are written by the job, and the supervisor reads them: a manifest
nested past the JSON parser's depth, a FIFO in a manifest's place, a huge sparse one, fields of the
wrong kind make that checkpoint damaged, never a crash of the reader nor a reader blocked for good
(issue 19.1). The resume goes to the newest checkpoint that is whole."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from tests.real.runs import script, status, tg, wait_for
from trainguard import Checkpointer
from trainguard.checkpoint import layouts

MANIFESTS = {
    1: lambda path: path.write_text("[" * 200_000),  # RecursionError in json.loads
    2: os.mkfifo,  # open() waits for a writer that never comes
    3: lambda path: (path.touch(), os.truncate(path, 1 << 40)),  # a 1 TB sparse file
    4: lambda path: path.write_text(json.dumps({"format": 1, "step": 4, "time": 0, "files": {"tree.pkl": 7}})),
    5: lambda path: path.write_text('{"format": 1, "step": 1e999, "time": 0, "files": {}}'),
}


def damaged_folder(folder: Path, *, sharded: bool = True) -> Path:
    """A folder with a whole checkpoint of step 0, and steps 1-5, each with one kind of bad manifest;
    ``sharded``: and below it the folder of a job of two ranks whose newest job.json is nested."""
    with Checkpointer(folder, every=None, keep=10, handle_signals=False, asynchronous=False) as ckpt:
        for step in range(6):
            ckpt.save({"step": step}, step)
    for step, spoil in MANIFESTS.items():
        manifest = folder / f"step-{step:012d}" / "manifest.json"
        manifest.unlink()
        spoil(manifest)
    if not sharded:
        return folder
    job = folder / "sharded"  # a job of several ranks whose job.json is nested
    for rank in range(2):
        with Checkpointer(job, rank=rank, world_size=2, handle_signals=False, asynchronous=False) as ckpt:
            ckpt.save({"step": 0}, 0)
            ckpt.save({"step": 1}, 1)
    (job / "step-000000000001" / "job.json").write_text('{"a":' * 100_000)
    return folder


def within(seconds: float, work):
    """``work()``'s value, or a failure when it did not return in time (it blocked, as on a FIFO)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked: a FIFO was opened"
    assert result, "raised: see the thread's traceback above"
    return result[0]


def test_the_supervisors_reader_calls_each_bad_manifest_damaged(tmp_path: Path) -> None:
    folder = damaged_folder(tmp_path / "ckpt")
    found = within(20, lambda: {c.step: c for c in layouts.scan(folder)})
    assert sorted(found) == [0, 1, 2, 3, 4, 5]
    assert [step for step, c in found.items() if c.complete] == [0]
    assert within(20, lambda: layouts.newest_complete(folder)).step == 0
    job = within(20, lambda: layouts.scan(folder / "sharded"))
    assert [(c.step, c.complete) for c in job] == [(1, False), (0, True)]


def test_the_library_skips_each_bad_manifest_as_damaged(tmp_path: Path) -> None:
    folder = damaged_folder(tmp_path / "ckpt")

    def load() -> tuple:
        with Checkpointer(folder, handle_signals=False) as ckpt:
            return ckpt.load_latest(), ckpt.damaged

    state, damaged = within(20, load)
    assert state == {"step": 0} and len(damaged) == 5, damaged
    assert any("not a regular file" in reason for reason in damaged)
    assert any("RecursionError" in reason for reason in damaged)


@pytest.mark.real
def test_a_run_whose_job_left_bad_manifests_resumes_from_the_whole_checkpoint(tmp_path: Path) -> None:
    job = script(tmp_path, "job.py", f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from tests.checkpoint.test_untrusted_manifests import damaged_folder
        from pathlib import Path
        if os.environ["TRAINGUARD_ATTEMPT"] == "1":
            damaged_folder(Path(os.environ["TRAINGUARD_CHECKPOINT_DIR"]), sharded=False)
            os.kill(os.getpid(), 9)  # a death another attempt may cure
        print("resumed from", os.environ.get("TRAINGUARD_RESUME_FROM"), flush=True)
    """)  # fmt: skip
    folder = tmp_path / "ckpt"
    started = tg("run", "--max-restarts", "1", "--checkpoint-dir", str(folder), "--", sys.executable, job)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split("started run ", 1)[1].split()[0]
    wait_for(lambda: status(run_id)["state"] in ("succeeded", "failed"), timeout=60, what="the run to end")
    info = status(run_id)
    assert info["state"] == "succeeded" and info.get("supervisor") != "gone", info
    assert f"resumed from {folder / 'step-000000000000'}" in tg("logs", run_id).stdout
