"""Save requests (issue 20): the supervisor writes ``{"id", "time", "reason", "then"}`` to
TRAINGUARD_SAVE_REQUEST_FILE; the job saves at its next step end, reports ``save_request_done``
through its progress file once the checkpoint is on disk, and trains on, or stops as on SIGUSR1
("then": "stop"). Looking costs one stat every 0.5 s; nothing in the file can block or break the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.checkpoint.test_unpolled_signal import ASKS
from tests.real.runs import script, wait_for
from trainguard import Checkpointer
from trainguard import progress as progress_module
from trainguard.checkpoint.saverequest import SaveRequests, parse_request


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write_request(path: Path, request_id: int, then: str = "continue", **extra) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"id": request_id, "time": time.time(), "reason": "RAM runs out in 40 s",
                               "then": then, **extra}))  # fmt: skip
    os.replace(tmp, path)  # as the supervisor writes it: whole, at once


def test_a_request_is_read_once_at_most_every_check_period(tmp_path: Path) -> None:
    path, clock = tmp_path / "request.json", Clock()
    requests = SaveRequests(str(path), clock=clock, check_every_s=0.5)
    assert requests.check() is None  # no file yet: nothing asked
    write_request(path, 1)
    clock.now += 0.2
    assert requests.check() is None  # not looked at again so soon
    clock.now += 0.4
    request = requests.check()
    assert request is not None and request.id == 1 and not request.stop
    requests.taken()
    assert requests.check() is None and requests.answering == request
    clock.now += 1
    assert requests.check() is None  # the same request again: already taken
    write_request(path, 2, then="stop")
    clock.now += 1
    assert requests.check().stop


def test_nothing_in_the_file_blocks_or_breaks_the_job(tmp_path: Path) -> None:
    path, clock = tmp_path / "request.json", Clock()
    requests = SaveRequests(str(path), clock=clock, check_every_s=0)
    for content in ("[" * 200_000, "{}", '{"id": "7", "time": 1}', '{"id": 3, "time": "now"}', "\xff\xfe"):
        path.write_text(content)
        assert requests.check() is None, content
    path.unlink()
    os.mkfifo(path)  # a FIFO nobody writes: opening it for reading would wait for good
    done = threading.Event()
    threading.Thread(target=lambda: (requests.check(), done.set()), daemon=True).start()
    assert done.wait(5), "the look at a FIFO blocked"
    assert parse_request({"id": 1, "time": 2.0, "then": "restart"}).stop is False  # unknown: go on


def test_a_request_made_before_the_process_started_is_not_for_it(tmp_path: Path) -> None:
    path = tmp_path / "request.json"
    write_request(path, 9, then="stop")
    requests = SaveRequests(str(path), check_every_s=0, not_before=time.time() + 1)  # started after it
    assert requests.check() is None


def test_a_requested_save_is_taken_at_the_next_step_and_reported_once_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request, progress = tmp_path / "request.json", tmp_path / "progress.json"
    monkeypatch.setenv("TRAINGUARD_SAVE_REQUEST_FILE", str(request))
    monkeypatch.setenv("TRAINGUARD_PROGRESS_FILE", str(progress))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(progress_module, "_record", {})  # what earlier tests in this process reported
    saved = []
    with Checkpointer(tmp_path / "ckpt", every="1h", handle_signals=False) as ckpt:
        for step in range(5):
            assert not ckpt.maybe_save(step, {"step": step})
        write_request(request, 3)
        time.sleep(0.6)
        for step in range(5, 40):
            if ckpt.maybe_save(step, {"step": step}):
                saved.append(step)
            time.sleep(0.02)
        assert not ckpt.stop_requested  # "then": "continue": training goes on
    assert saved == [5]
    record = json.loads(progress.read_text())
    assert (record["save_request_done"], record["save_request_step"]) == (3, 5)
    assert "stop_signal" not in record


def test_then_stop_saves_and_leaves_the_loop_like_sigusr1(tmp_path: Path) -> None:
    request, progress = tmp_path / "request.json", tmp_path / "progress.json"
    job = script(tmp_path, "job.py", ASKS)  # a loop that saves on a stop signal, and no period
    env = {**os.environ, "TRAINGUARD_SAVE_REQUEST_FILE": str(request), "TRAINGUARD_PROGRESS_FILE": str(progress)}
    env.pop("RANK", None)
    process = subprocess.Popen([sys.executable, job, str(tmp_path / "ckpt")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        for line in process.stdout:
            if line.startswith("step 10"):
                write_request(request, 1, then="stop")
                break
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    stopped = int(out.split("saved and stopped at ")[1].split()[0])
    record = json.loads(progress.read_text())
    assert record["stop_signal"] == 10 and record["save_request_done"] == 1
    assert record["save_request_step"] == stopped
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == [f"step-{stopped:012d}"]
    assert "save request 1" in err


def test_the_loop_helper_saves_on_a_request_and_trains_on(tmp_path: Path) -> None:
    request, progress, saves = tmp_path / "request.json", tmp_path / "progress.json", tmp_path / "saves.txt"
    job = script(tmp_path, "job.py", f"""
        import time
        from trainguard.integrations.loop import PreemptionGuard
        guard = PreemptionGuard()
        for step in range(150):
            print("step", step, flush=True)
            if guard.step_end(step, save=lambda: open({str(saves)!r}, "a").write(f"{{step}}\\n")):
                break
            time.sleep(0.02)
        print("finished at", step, flush=True)
    """)  # fmt: skip
    env = {**os.environ, "TRAINGUARD_SAVE_REQUEST_FILE": str(request), "TRAINGUARD_PROGRESS_FILE": str(progress)}
    env.pop("RANK", None)
    process = subprocess.Popen([sys.executable, job], stdout=subprocess.PIPE, text=True, env=env)
    for line in process.stdout:
        if line.startswith("step 10"):
            write_request(request, 5)
            break
    wait_for(saves.exists, timeout=10, what="the requested save")
    assert process.wait(timeout=30) == 0
    assert "finished at 149" in process.stdout.read()
    (saved,) = map(int, saves.read_text().split())
    record = json.loads(progress.read_text())
    assert (record["save_request_done"], record["save_request_step"]) == (5, saved)
