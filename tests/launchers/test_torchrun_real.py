"""`trainguard run -- torchrun --nproc-per-node 2 ...` with real torchrun on CPU (gloo, 2 processes):
one rank raising, one rank OOM-killed in the job's memory cgroup, one rank hanging. Each time the
attempt is diagnosed with the right cause AND the rank that failed first (not rank 0's "Connection
closed by peer" or the agent's SIGTERM to the others), every rank's files are kept with the attempt,
the run restarts, every rank resumes from the step complete for both, and both ranks end with equal
weights."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.launchers.jobs import TRAIN
from tests.real import faults
from tests.real.runs import free_port, script, tg

pytestmark = [pytest.mark.real, pytest.mark.slow]
torch = pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")


def torchrun(tmp_path: Path, *run_args: str, fault: str, **env: str):
    job = script(tmp_path, "train.py", TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    launcher = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    environment = {**os.environ, "FAULT": fault, "OUT_DIR": str(out), **env}
    done = tg("run", "--foreground", "--name", "ddp", *run_args, "--", launcher, "--nproc-per-node", "2",
              "--master-port", str(free_port()), job, env=environment, timeout=300)  # fmt: skip
    info = json.loads(tg("status", "ddp", "--json").stdout)
    return done, info, out


def resumed_and_equal(info: dict, out: Path) -> int:
    """Both ranks of attempt 2 resumed after the step the supervisor chose (the newest one complete
    for both: a save still in flight when the job died does not count), and ended equal."""
    second = info["attempts"][1]
    assert second["resumed_from"], second
    step = int(Path(second["resumed_from"]).name.split("-")[1])
    assert step >= 4  # the fault came at step 12, after the saves of steps 4 and 9
    log = Path(second["log_path"]).read_text()
    assert (
        f"rank 0 attempt 2 starts at step {step + 1} " in log and f"rank 1 attempt 2 starts at step {step + 1} " in log
    )
    assert info["state"] == "succeeded"
    zero, one = (torch.load(out / f"final-rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(zero[k], one[k]) for k in zero)
    return step


def rank_files(home: Path, info: dict, n: int) -> list[str]:
    folder = home / "runs" / info["id"] / f"attempt-{n}.ranks"
    return sorted(str(p.relative_to(folder)).split("/", 1)[1] for p in folder.rglob("*") if p.is_file())


def test_one_rank_raising_is_python_error_on_that_rank_and_the_run_resumes(tmp_path: Path, home: Path) -> None:
    done, info, out = torchrun(tmp_path, "--retry", "python_error=yes", fault="raise")
    assert done.returncode == 0, done.stderr
    first = info["attempts"][0]
    assert first["cause"] == "python_error", first["diagnosis"]
    assert first["diagnosis"]["first_failure"]["rank"] == 1
    assert any("ValueError: bad batch at step 12" in e["text"] for e in first["diagnosis"]["evidence"])
    # every rank's output is kept with the attempt, in torchrun's own layout
    assert rank_files(home, info, 1) == ["attempt_0/0/stderr.log", "attempt_0/0/stdout.log",
                                         "attempt_0/1/stderr.log", "attempt_0/1/stdout.log"]  # fmt: skip
    assert (home / "runs" / info["id"] / "attempt-1.error.json.rank1").exists()  # rank 1's own exception
    resumed_and_equal(info, out)


def test_one_rank_oom_killed_in_the_memory_cgroup_is_host_oom_on_that_rank(tmp_path: Path, home: Path) -> None:
    if reason := faults.why_no_memory_cgroup():
        pytest.skip(reason)
    done, info, out = torchrun(tmp_path, "--memory-limit", "1500M", fault="oom")
    assert done.returncode == 0, done.stderr
    first = info["attempts"][0]
    assert first["cause"] == "host_oom" and first["confidence"] >= 0.99, first["diagnosis"]
    assert first["diagnosis"]["first_failure"]["rank"] == 1  # not rank 0, whose peer vanished
    texts = [e["text"] for e in first["diagnosis"]["evidence"]]
    assert any("OOM-killed" in t for t in texts)
    resumed_and_equal(info, out)


def test_one_rank_hanging_is_a_hang_of_that_rank_with_every_ranks_stack(tmp_path: Path, home: Path) -> None:
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed (pip install -e '.[test]')")
    done, info, out = torchrun(tmp_path, "--hang-timeout", "10s", "--grace", "3s", fault="hang")
    assert done.returncode == 0, done.stderr
    first = info["attempts"][0]
    assert first["cause"] == "hang", first["diagnosis"]
    # rank 1 sleeps in the training code; rank 0 waits for it inside all_reduce: rank 1 is the one
    assert first["diagnosis"]["first_failure"]["rank"] == 1
    dump = (home / "runs" / info["id"] / "hang-attempt-1.txt").read_text()
    stacks = {part.split(" ---")[0]: part for part in dump.split("--- process ")[1:]}
    main_stacks = {pid: text for pid, text in stacks.items() if "train.py" in text.split("Thread", 1)[-1]}
    by_rank = {("rank 0" if "(rank 0, local rank 0)" in pid else "rank 1"): text for pid, text in main_stacks.items()}
    assert "all_reduce" in by_rank["rank 0"] and "all_reduce" not in by_rank["rank 1"]
    resumed_and_equal(info, out)
