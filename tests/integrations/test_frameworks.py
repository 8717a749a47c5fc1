"""HF Trainer, Lightning, Accelerate and DeepSpeed under `trainguard run`, for real, on CPU: the
examples in examples/ (tiny models built from a config, fixed seeds) are

- sent SIGTERM from outside mid-training: they save at the next step end within the grace, exit 0,
  the attempt is named `preempted`, the next one resumes at the saved step, and the run finishes with
  the same final weights as an uninterrupted one;
- SIGKILLed while a checkpoint is half written: the cut checkpoint is skipped (reported, not deleted),
  the next attempt resumes from the one before it, and the final weights are again the same.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.real.runs import status, tg, wait_for
from trainguard.checkpoint import layouts

pytestmark = [pytest.mark.slow, pytest.mark.real]

ROOT = Path(__file__).resolve().parents[2]
SLOW_SAVE = Path(__file__).with_name("slow_save.py")
FINISHED = re.compile(r"^finished at step (\d+) weights ([0-9a-f]{64})$", re.M)
STOPPED = re.compile(r"trainguard: signal (\d+): saved (?:at step |checkpoint-)?(\S+?)(?:\.ckpt)?, stopping")


@dataclass(frozen=True)
class Framework:
    name: str
    module: str  # skipped without it
    script: str
    dir_arg: str
    layout: str
    slow_file: str  # regex: the file of the second periodic save that the SIGKILL test cuts
    before_cut: str  # the checkpoint the next attempt must resume from after that cut
    cut: str  # the checkpoint left cut


FRAMEWORKS = [
    Framework("hf", "transformers", "hf_trainer.py", "--output-dir", "hf",
              r"checkpoint-100/optimizer\.pt$", "checkpoint-50", "checkpoint-100"),
    Framework("lightning", "lightning", "lightning_train.py", "--dir", "lightning",
              r"step=200\.ckpt$", "epoch=0-step=100.ckpt", "epoch=1-step=200.ckpt"),
    Framework("accelerate", "accelerate", "accelerate_loop.py", "--project-dir", "accelerate",
              r"checkpoint_1/optimizer\.bin$", "checkpoints/checkpoint_0", "checkpoints/checkpoint_1"),
    Framework("deepspeed", "deepspeed", "deepspeed_loop.py", "--dir", "deepspeed",
              r"global_step400/zero_pp_rank_0_mp_rank_00_optim_states\.pt$", "global_step200", "global_step400"),
]  # fmt: skip


def needs(framework: Framework) -> None:
    if importlib.util.find_spec(framework.module) is None:
        pytest.skip(f"{framework.module} is not installed (pip install -e '.[frameworks]'; .ci/run does)")


def attempt_log(run_id: str, n: int) -> str:
    return tg("logs", run_id, "--attempt", str(n)).stdout


def example(framework: Framework, folder: Path) -> list[str]:
    return [str(ROOT / "examples" / framework.script), framework.dir_arg, str(folder)]


_baselines: dict[str, str] = {}


def baseline(framework: Framework, tmp_path: Path) -> str:
    """The final weights of an uninterrupted run, outside trainguard."""
    if framework.name not in _baselines:
        done = subprocess.run([sys.executable, *example(framework, tmp_path / "baseline")], capture_output=True,
                              text=True, timeout=600, check=False, cwd=tmp_path)  # fmt: skip
        found = FINISHED.search(done.stdout)
        assert done.returncode == 0 and found, done.stdout[-2000:] + done.stderr[-3000:]
        _baselines[framework.name] = found.group(2)
    return _baselines[framework.name]


def start(framework: Framework, folder: Path, cwd: Path, command: list[str], env: dict | None = None) -> str:
    started = tg("run", "--checkpoint-dir", str(folder), "--checkpoint-layout", framework.layout, "--grace", "60s",
                 "--", sys.executable, *command, cwd=cwd, env=env)  # fmt: skip
    assert started.returncode == 0, started.stderr
    return started.stdout.split("started run ", 1)[1].split()[0]


def finish(run_id: str, expected_weights: str) -> dict:
    info = wait_for(lambda: (s := status(run_id))["state"] in ("succeeded", "failed") and s, 600, "the run to end")
    log = attempt_log(run_id, len(info["attempts"]))
    assert info["state"] == "succeeded", log[-3000:]
    found = FINISHED.search(log)
    assert found, log[-3000:]
    assert found.group(2) == expected_weights, "the resumed run did not end with the weights of an uninterrupted one"
    return info


def _kill_group(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


# SIGUSR1 too for Lightning: on its own, Lightning saves on it only in its Slurm mode.
SIGNALS = [(f, signal.SIGTERM) for f in FRAMEWORKS] + [(FRAMEWORKS[1], signal.SIGUSR1)]


@pytest.mark.parametrize(("framework", "signum"), SIGNALS, ids=lambda v: getattr(v, "name", None) or str(v))
def test_sigterm_mid_training_saves_restarts_as_preempted_and_resumes_at_the_saved_step(
    framework: Framework, signum: signal.Signals, tmp_path: Path, home: Path
) -> None:
    needs(framework)
    expected = baseline(framework, tmp_path)
    folder = tmp_path / "ckpt"
    run_id = start(framework, folder, tmp_path, example(framework, folder))
    job_pid = None
    try:
        wait_for(lambda: layouts.newest_complete(folder, framework.layout), 300, "the first periodic checkpoint")
        job_pid = status(run_id)["pid"]
        os.kill(job_pid, signum)  # a scheduler's SIGTERM (or pre-timeout SIGUSR1), not trainguard's own stop
        sent = time.monotonic()
        first = wait_for(lambda: (a := status(run_id)["attempts"][0])["ended_at"] and a, 60, "the job to save and exit")
        took = time.monotonic() - sent
        log = attempt_log(run_id, 1)
        assert first["exit_code"] == 0 and first["cause"] == "preempted", log[-3000:]
        assert took < 60, f"saving on SIGTERM took {took:.1f} s, longer than the grace"
        stopped = STOPPED.search(log)
        assert stopped and int(stopped.group(1)) == signum, log[-3000:]
        info = finish(run_id, expected)
    finally:
        _kill_group(job_pid if status(run_id)["state"] not in ("succeeded", "failed") else None)
    second = info["attempts"][1]
    saved = layouts.scan(folder, framework.layout)
    resumed = next(c for c in saved if c.path == second["resumed_from"])
    step = int(re.search(r"(\d+)$", stopped.group(2)).group(1))
    if framework.name == "accelerate":  # checkpoint_N counts saves; the step is in the log lines
        assert resumed.complete
    else:
        assert resumed.step == step + (1 if framework.name == "deepspeed" else 0), (resumed, step)
    resumed_line = re.search(r"trainguard: resumed at step (\d+)", attempt_log(run_id, 2))
    assert resumed_line and int(resumed_line.group(1)) == step
    print(f"{framework.name}: {signum.name} -> saved step {step} in {took:.1f} s -> preempted -> resumed at {step}")


@pytest.mark.parametrize("framework", FRAMEWORKS, ids=lambda f: f.name)
def test_sigkill_during_a_save_skips_the_cut_checkpoint_and_resumes_from_the_one_before(
    framework: Framework, tmp_path: Path, home: Path
) -> None:
    needs(framework)
    expected = baseline(framework, tmp_path)
    folder = tmp_path / "ckpt"
    marker = tmp_path / "paused"
    env = dict(os.environ, TG_TEST_SLOW_SAVE=framework.slow_file, TG_TEST_SLOW_MARKER=str(marker))
    mounted = None
    if framework.name == "lightning":
        # Lightning saves to a temporary file and moves it into place: atomic on one filesystem, a
        # plain copy when the temporary folder is on another one (a tmpfs /tmp, a mounted data disk).
        mounted = _tmpfs(tmp_path / "other-fs")
        env["TMPDIR"] = str(mounted)
    run_id = start(framework, folder, tmp_path, [str(SLOW_SAVE), *example(framework, folder)], env)
    job_pid = None
    try:
        wait_for(marker.exists, 300, "the second periodic save to be half written")
        job_pid = status(run_id)["pid"]
        cut = folder / framework.cut
        found = {os.path.relpath(c.path, folder): c for c in layouts.scan(folder, framework.layout)}
        assert framework.cut in found and not found[framework.cut].complete, found
        os.kill(job_pid, signal.SIGKILL)
        second = wait_for(lambda: len(a := status(run_id)["attempts"]) > 1 and a[1], 120, "the next attempt")
        assert cut.exists(), "the cut checkpoint was deleted"
        assert second["resumed_from"] == str(folder / framework.before_cut)
        first = status(run_id)["attempts"][0]
        assert first["signal"] == 9 and first["cause"] is not None, first  # a death, restarted
        whole_log = tg("logs", run_id).stdout
        assert f"skipped incomplete {cut}" in whole_log, whole_log[-3000:]  # reported, not chosen
        finish(run_id, expected)
    finally:
        _kill_group(job_pid if status(run_id)["state"] not in ("succeeded", "failed") else None)
        if mounted is not None:
            subprocess.run(["umount", "-l", str(mounted)], check=False)
    print(f"{framework.name}: SIGKILL in {framework.cut} -> skipped -> resumed from {framework.before_cut}")


def _tmpfs(path: Path) -> Path:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for Lightning's cross-filesystem save needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    return path
