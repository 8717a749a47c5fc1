"""Under `run --foreground` (what Kubernetes, Docker, systemd and Slurm run) the job's output reaches
trainguard's own standard output, where `kubectl logs`, `docker logs`, slurm-%j.out and journald look,
and a slow or closed reader of it never slows or stops the job. A detached run inside a Slurm job
(it would leave the allocation) is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.real.runs import status, tg

PRINTER = "import sys\nfor i in range({n}):\n    print('line', i, 'x' * {width}, flush=True)\nprint('done', flush=True)\n"


def test_the_job_s_output_and_errors_reach_standard_output() -> None:
    done = tg("run", "--foreground", "--", "sh", "-c", "echo hi; echo oops >&2")
    assert done.returncode == 0, done.stderr
    assert "hi\n" in done.stdout and "oops\n" in done.stdout


def test_a_closed_reader_ends_the_copy_not_the_job(tmp_path: Path) -> None:
    job = tmp_path / "printer.py"
    job.write_text(PRINTER.format(n=20000, width=10))
    pipeline = f"set -o pipefail; {sys.executable} -m trainguard run --foreground -- {sys.executable} {job} | head -n 1"
    done = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.startswith("====") or done.stdout.startswith("line"), done.stdout
    runs = tg("ps", "--json").stdout
    run_id = runs.split('"id": "', 1)[1].split('"', 1)[0]
    info = status(run_id)
    assert info["state"] == "succeeded", (info, done.stderr)
    log = Path(info["attempts"][0].get("log_path") or info["log_path"]).read_text()
    assert "line 19999" in log and "done" in log  # the job wrote everything to its log


def test_a_reader_that_never_reads_does_not_hold_the_job_or_the_end(tmp_path: Path) -> None:
    job = tmp_path / "printer.py"
    job.write_text(PRINTER.format(n=100000, width=200))  # ~20 MB: far past a pipe's buffer
    started = time.monotonic()
    runner = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--foreground", "--", sys.executable,
                               str(job)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert runner.wait(timeout=90) == 0  # its stdout was never read
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.stdout.close()
    assert time.monotonic() - started < 90


def test_a_detached_run_inside_a_slurm_job_is_refused() -> None:
    env = dict(os.environ, SLURM_JOB_ID="4242")
    done = tg("run", "--", "true", env=env)
    assert done.returncode == 2 and "4242" in done.stderr and "--foreground" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert tg("run", "--foreground", "--", "true", env=env).returncode == 0
