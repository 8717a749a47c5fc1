"""`run --checkpoint-layout`: the layout travels with the run to the supervisor, which hands the
newest COMPLETE checkpoint to the job (TRAINGUARD_RESUME_FROM and --resume-arg) and reports the cut
ones; and PreemptionGuard, the loop helper, on real signals. No framework needed."""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integrations.test_frameworks import status, tg

pytestmark = pytest.mark.real

JOB = """
import json, os, sys
print("ARGV " + json.dumps(sys.argv[1:]))
print("RESUME " + os.environ.get("TRAINGUARD_RESUME_FROM", "-"))
"""


def _hf_checkpoint(folder: Path, step: int, *, complete: bool) -> None:
    folder.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    if complete:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def test_the_newest_complete_hf_checkpoint_reaches_the_job_and_the_cut_one_is_reported(
    tmp_path: Path, home: Path
) -> None:
    ckpt = tmp_path / "out"
    _hf_checkpoint(ckpt / "checkpoint-10", 10, complete=True)
    _hf_checkpoint(ckpt / "checkpoint-20", 20, complete=False)  # killed before trainer_state.json
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    done = tg("run", "--foreground", "--restart", "never", "--checkpoint-dir", str(ckpt), "--checkpoint-layout", "hf",
              "--resume-arg", "--resume_from_checkpoint {checkpoint}", "--", sys.executable, str(job))  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = done.stderr.split("run ", 1)[1].split(",")[0]
    info = status(run_id)
    assert info["attempts"][0]["resumed_from"] == str(ckpt / "checkpoint-10")
    log = tg("logs", run_id).stdout
    assert f'ARGV ["--resume_from_checkpoint", "{ckpt / "checkpoint-10"}"]' in log
    assert f"RESUME {ckpt / 'checkpoint-10'}" in log
    assert f"skipped incomplete {ckpt / 'checkpoint-20'}: no trainer_state.json" in log
    assert (ckpt / "checkpoint-20").exists()  # reported, never deleted


def test_layout_and_glob_together_are_refused_and_an_unknown_layout_too(tmp_path: Path, home: Path) -> None:
    both = tg("run", "--checkpoint-glob", "*.pt", "--checkpoint-layout", "hf", "--", sys.executable, "-c", "0")
    assert both.returncode == 2 and "give one" in both.stderr and "Traceback" not in both.stderr
    unknown = tg("run", "--checkpoint-layout", "keras", "--", sys.executable, "-c", "0")
    assert unknown.returncode == 2 and "keras" in unknown.stderr and "Traceback" not in unknown.stderr


GUARDED = """
import os, signal, sys, time
from trainguard import progress
from trainguard.integrations.loop import PreemptionGuard
saves = []
guard = PreemptionGuard()
for step in range(100000):
    time.sleep(0.01)
    if step == 5:
        print("ready", flush=True)
    if guard.step_end(step, save=lambda: saves.append(step)):
        print(f"left at {step} after {len(saves)} save(s)", flush=True)
        break
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_guard_saves_once_on_a_stop_signal_and_tells_the_supervisor(tmp_path: Path, signum: int) -> None:
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(GUARDED))
    record = tmp_path / "progress.json"
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                           env={"TRAINGUARD_PROGRESS_FILE": str(record), "PATH": "/usr/bin:/bin",
                                "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})  # fmt: skip
    assert job.stdout.readline().strip() == "ready"
    job.send_signal(signum)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 0
    assert "after 1 save(s)" in out
    left_at = int(out.split("left at ")[1].split()[0])
    from trainguard import progress

    reported = progress.read(str(record))
    assert reported["stop_signal"] == signum and reported["step"] == left_at


def test_trainguard_and_its_loop_helpers_import_no_framework() -> None:
    code = (
        "import sys, trainguard, trainguard.checkpoint.layouts, trainguard.integrations.loop, "
        "trainguard.integrations.accelerate, trainguard.integrations.deepspeed, trainguard.supervisor.job; "
        "print(sorted(m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', 'accelerate', "
        "'deepspeed') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
