"""The example script (docs/library.md): stopped by SIGTERM, started again, it resumes instead of starting over."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def example(steps: int, folder: Path) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / "train_resumable.py"), "--steps", str(steps), "--ckpt", str(folder)]


def test_the_example_resumes_after_sigterm(tmp_path: Path) -> None:
    first = subprocess.Popen(example(100_000, tmp_path), stdout=subprocess.PIPE, text=True)
    for line in first.stdout:
        if line.startswith("step 300 "):
            first.send_signal(signal.SIGTERM)
            break
    rest = first.stdout.read()
    assert first.wait(timeout=60) == 0
    last_line = rest.strip().splitlines()[-1]  # "stopping at step N: state saved"
    stopped = int(last_line.split()[3].rstrip(":"))
    second = subprocess.run(example(stopped + 50, tmp_path), capture_output=True, text=True, timeout=120, check=True)
    assert second.stdout.splitlines()[0] == f"resumed from step {stopped}"
    assert second.stdout.strip().endswith("done")
