"""A stop never costs the checkpoint of the most common training loop: a real DataLoader with worker
processes and a Checkpointer whose periodic save is far away (every 30 min), stopped by
`trainguard stop`, by SIGTERM to `run --foreground` (what Kubernetes sends PID 1) and by a signal to
the job's whole process group (what srun, scancel and a launcher's killpg do). Before, the stop
signal reached the workers first and the training process died in `next(it)` without saving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.loader_jobs import SLOW_LOADER_HEAD
from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = [pytest.mark.real, pytest.mark.slow]  # real DataLoader workers, about 2.5 min: the slower tier
pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")

LOOP = SLOW_LOADER_HEAD + """
    if __name__ == "__main__":
        ckpt = Checkpointer(sys.argv[2], every="30m")
        state = ckpt.load_latest()
        step = state["step"] + 1 if state else 0
        loader = DataLoader(Slow(), batch_size=4, num_workers=2, multiprocessing_context=sys.argv[1])
        for batch in loader:
            print("step", step, flush=True)
            ckpt.maybe_save(step, lambda: {"step": step})
            if ckpt.stop_requested:
                break
            step += 1
        ckpt.wait()
        print("left the loop at step", step, flush=True)
"""


def _newest_step(folder: Path) -> int | None:
    from trainguard import Checkpointer

    state = Checkpointer(str(folder), every=None).load_latest()
    return state["step"] if state else None


def _steps_printed(text: str) -> int:
    return max((int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")), default=-1)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_trainguard_stop_saves_a_dataloader_loop(tmp_path: Path, method: str) -> None:
    job = script(tmp_path, "loop.py", LOOP)
    folder = tmp_path / "ckpt"
    started = tg("run", "--grace", "30s", "--max-restarts", "0", "--", sys.executable, job, method, str(folder))
    run_id = run_id_from(started.stdout)
    wait_for(lambda: _steps_printed(tg("logs", run_id).stdout) >= 10, timeout=60, what="ten steps")
    stopped = tg("stop", run_id, "--grace", "30s")
    assert stopped.returncode == 0, stopped.stderr
    assert status(run_id)["state"] == "stopped"
    log = tg("logs", run_id).stdout
    assert "left the loop at step" in log, log[-2000:]
    assert _newest_step(folder) == _steps_printed(log) >= 10  # saved where it stopped: nothing lost


def test_sigterm_to_foreground_saves_a_dataloader_loop(tmp_path: Path) -> None:
    job = script(tmp_path, "loop.py", LOOP)
    folder = tmp_path / "ckpt"
    out = tmp_path / "foreground.out"
    with open(out, "wb") as sink:
        runner = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--foreground", "--grace", "30s",
                                   "--max-restarts", "0", "--", sys.executable, job, "fork", str(folder)],
                                  stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: _ran_steps(folder.parent), timeout=60, what="ten steps")
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert _newest_step(folder) is not None and _newest_step(folder) >= 10, out.read_text()[-2000:]


def _ran_steps(tmp_path: Path) -> bool:
    logs = list((tmp_path / "state" / "runs").glob("*/attempt-1.log"))
    return bool(logs) and _steps_printed(logs[0].read_text(errors="replace")) >= 10


def test_a_signal_to_the_whole_group_spares_forked_workers_until_the_save(tmp_path: Path) -> None:
    # No trainguard run here: the library alone, as under srun or a launcher that signals every process.
    job = script(tmp_path, "loop.py", LOOP)
    folder = tmp_path / "ckpt"
    log = tmp_path / "job.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen([sys.executable, job, "fork", str(folder)], stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: _steps_printed(log.read_text(errors="replace")) >= 10, timeout=60, what="ten steps")
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()[-2000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert "left the loop at step" in text
    assert _newest_step(folder) == _steps_printed(text)
