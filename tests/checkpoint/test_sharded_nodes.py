"""Ranks of one job on nodes that counted their attempts apart, a save request that reaches one node
only, and the files ranks share: real torch TCPStores between two Checkpointers (the store every rank
of a launch holds), each rank with its own node's environment while it decides (issue 19.7, 20)."""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path

import pytest

from tests.checkpoint.test_sharded import Clock, close, state, tcp_store_pair
from trainguard import Checkpointer
from trainguard.checkpoint import layouts

# Node 0 ended peer_failure and its trainguard restarted it (attempt 2, its torchrun agent restarted
# once); node 1 started fresh. Both are ranks of one torchrun launch.
NODES = [
    {"TRAINGUARD_ATTEMPT": "2", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_RUN_ID": "exp"},
    {"TRAINGUARD_ATTEMPT": "1", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_RUN_ID": "exp"},
]


def on_node(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    for key, value in NODES[rank].items():
        monkeypatch.setenv(key, value)


class TwoNodes:
    """Two ranks of one job in this process, each deciding with its own node's environment and its
    own client of the job's store, 100 ms a step, in lockstep."""

    def __init__(self, folder: Path, monkeypatch: pytest.MonkeyPatch, clocks: list[Clock], **kwargs) -> None:
        server, client = tcp_store_pair()
        stores = {0: server, 1: client}
        self.deciding = 0
        self.monkeypatch, self.clocks = monkeypatch, clocks
        monkeypatch.setattr("trainguard.checkpoint.checkpointer.job_store", lambda: stores[self.deciding])
        self.ranks = []
        for rank in range(2):
            on_node(monkeypatch, rank)
            self.ranks.append(Checkpointer(folder, rank=rank, world_size=2, handle_signals=False,
                                           clock=clocks[rank], **kwargs))  # fmt: skip

    def train(self, steps: range) -> dict[int, list[int]]:
        saved: dict[int, list[int]] = {0: [], 1: []}
        for step in steps:
            for rank, ckpt in enumerate(self.ranks):
                self.deciding = rank
                on_node(self.monkeypatch, rank)
                self.clocks[rank].now += 0.1
                if ckpt.maybe_save(step, state(rank, step)):
                    saved[rank].append(step)
                ckpt.wait()
        return saved


def test_ranks_of_nodes_with_different_attempts_save_the_same_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    job = TwoNodes(tmp_path, monkeypatch, [Clock(0.0), Clock(-0.3)], every="10s")  # rank 1 started 0.3 s later
    with caplog.at_level(logging.WARNING, logger="trainguard.checkpoint"):
        saved = job.train(range(300))
    close(job.ranks)
    # Before: each rank planned alone (its plans keyed by its own attempt), both warned falsely, and
    # the saves by time fell on different steps: no step complete.
    assert "only 1 of the job's 2 ranks made a Checkpointer" not in caplog.text
    assert saved[0] == saved[1] and len(saved[0]) >= 2, saved
    assert {c.step for c in layouts.scan(tmp_path) if c.complete} >= set(saved[0][-3:])


def test_a_save_request_that_reaches_one_node_is_taken_by_every_rank_at_one_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request_file = tmp_path / "request-node-1.json"
    progress_file = tmp_path / "progress.json"
    monkeypatch.setenv("TRAINGUARD_PROGRESS_FILE", str(progress_file))
    monkeypatch.setenv("RANK", "1")  # the progress of the rank whose node asked: progress.json.rank1
    NODES[1]["TRAINGUARD_SAVE_REQUEST_FILE"] = str(request_file)
    try:
        job = TwoNodes(tmp_path, monkeypatch, [Clock(0.0), Clock(0.0)], every="1h")
        assert job.train(range(20)) == {0: [], 1: []}
        request_file.write_text(json.dumps({"id": 4, "time": time.time(), "reason": "RAM", "then": "stop"}))
        time.sleep(0.6)  # the file is looked at every 0.5 s
        saved = job.train(range(20, 200))
    finally:
        del NODES[1]["TRAINGUARD_SAVE_REQUEST_FILE"]
    close(job.ranks)
    assert saved[0] == saved[1] and len(saved[0]) == 1, saved  # one save, at one step, on both ranks
    assert job.ranks[0].stop_requested and job.ranks[1].stop_requested
    (step,) = saved[0]
    assert [c.step for c in layouts.scan(tmp_path) if c.complete] == [step]
    record = json.loads(Path(f"{progress_file}.rank1").read_text())
    assert record["save_request_done"] == 4 and record["save_request_step"] == step
    assert record["stop_signal"] == 10  # stopped as SIGUSR1 stops a job


def test_the_lock_files_of_the_ranks_are_private(tmp_path: Path) -> None:
    old = tmp_path / ".writing.rank-00001.lock"
    old.touch(mode=0o644)  # left readable by an older version
    os.chmod(old, 0o644)
    for rank in range(2):
        ckpt = Checkpointer(tmp_path, rank=rank, world_size=2, handle_signals=False, asynchronous=False)
        ckpt.save(state(rank, 0), 0)
        ckpt.close()
    single = Checkpointer(tmp_path / "single", handle_signals=False, asynchronous=False)
    single.save({"step": 0}, 0)
    single.close()
    locks = sorted(tmp_path.rglob("*.lock"))
    assert [p.name for p in locks] == [".writing.rank-00000.lock", ".writing.rank-00001.lock", ".writing.lock"]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in locks} == {"0o600"}  # before: 0o644
