"""Every command the READMEs and the docs/ pages show (English and Chinese) works as written: each
`trainguard` line of their shell blocks is run here, in the order the page gives, against real runs
of a toy training script. Lines that need what this machine does not have (a Slurm cluster, a
Kubernetes pod, the network) are listed with the reason, never silently dropped."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS_LOG = ROOT / "src" / "trainguard" / "data" / "examples" / "ddp_cuda_oom.log"
FRONT_PAGES = ["README.md", "README.zh-CN.md"]
DOCS_PAGES = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md"))

# Lines that cannot run on a machine without these, and where they are proven instead.
ELSEWHERE = {
    "pip install": "installing is what .ci/run does from a clean clone",
    "python -m pytest": "the test suite itself",
    "srun ": "needs a Slurm cluster: the slow tier's local Slurm tests run it",
    "kubectl ": "needs a Kubernetes cluster",
    "sbatch ": "needs a Slurm cluster: the slow tier's local Slurm tests run it",
    "promtool ": "the Prometheus tests of the slow tier run it",
    "prometheus ": "the Prometheus tests of the slow tier run it",
    "curl ": "reaches a service started elsewhere",
    "docker ": "no Docker engine here",
    "nvidia-smi": "no GPU here",
    "sudo ": "changes the machine's own configuration (the Prometheus tests load the same files)",
    "SLURM_JOB_ID": "a line of a batch script: the slow tier's local Slurm tests run it",
    "--nnodes 2": "needs a second node: the slow tier's two simulated nodes run it (tests/launchers)",
}

TOY = """
import os, sys, time
from trainguard import Checkpointer
steps = int(os.environ.get("TOY_STEPS", "100000"))
ckpt = Checkpointer(every=None, every_steps=5, keep=2)
state = ckpt.load_latest()
start = state["step"] + 1 if state else 0
for step in range(start, steps):
    time.sleep(0.05)
    print(f"step {step} loss {1 / (step + 1):.4f}", flush=True)
    ckpt.maybe_save(step, lambda: {"step": step})
    if ckpt.stop_requested:
        break
"""


def readme_commands(path: Path) -> list[str]:
    commands = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
        if lang not in ("bash", "sh", ""):
            continue
        for raw in re.sub(r"\\\n\s*", " ", block).splitlines():  # a line continued with \ is one command
            line = re.split(r"\s{2,}#", raw)[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def variants(command: str) -> list[str]:
    """`status vit [--json]` is two commands: with and without what is in brackets."""
    optional = re.findall(r"\[([^\]]+)\]", command)
    bare = re.sub(r"\s*\[[^\]]+\]", "", command)
    return [bare] + [f"{bare} {extra}" for extra in optional if extra.startswith("-")]


def _sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TOY)
    (work / "train.log").write_bytes(CORPUS_LOG.read_bytes())
    for rank in range(3):
        (work / f"rank{rank}.log").write_bytes(CORPUS_LOG.read_bytes())
    (work / "dmesg.txt").write_text("[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
    (work / "notify.toml").write_text('[[notify]]\nkind = "webhook"\nurl = "http://127.0.0.1:9/hook"\n')
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "TRAINGUARD_HOME": str(tmp_path / "state"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return work, env


def _adapt(command: str, work: Path) -> str:
    """What a reader would substitute: their own data folder, the run they started (RUN)."""
    command = command.replace("/data/ckpt", str(work / "ckpt"))
    command = re.sub(r"\bRUN\b", "vit", command)
    command = command.replace("--attempt 2", "--attempt 1")  # an attempt the reader's run has
    return command.replace("--nproc-per-node 8", "--nproc-per-node 2")


@pytest.mark.slow  # up to about 40 s a page: every example, a torchrun among them
@pytest.mark.parametrize("page", FRONT_PAGES + DOCS_PAGES)
def test_every_readme_command_runs_as_written(tmp_path: Path, page: str) -> None:
    if shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("torchrun (torch) is not installed: pip install -e '.[test]'")
    lines = readme_commands(ROOT / page)
    if page not in FRONT_PAGES and not any("trainguard" in line for line in lines):
        pytest.skip(f"{page} shows no trainguard command in a shell block")
    work, env = _sandbox(tmp_path)
    if not any("--name vit" in line for line in lines):
        # A page that names the reader's run RUN: the reader started one before, as here.
        subprocess.run([sys.executable, "-m", "trainguard", "run", "--name", "vit", "--", "python", "train.py"],
                       cwd=work, env=env, capture_output=True, check=True, timeout=60)  # fmt: skip
    ran, elsewhere, failures = [], {}, []
    for line in lines:
        reason = next((why for prefix, why in ELSEWHERE.items() if prefix in line), None) or _missing_program(line, env)
        if reason is not None or "trainguard" not in line:
            elsewhere[line] = reason or "not a trainguard command"
            continue
        for command in variants(_adapt(line, work)):
            done = _run(command, work, env)
            ran.append(command)
            if done.returncode not in (0, 1) or "Traceback" in done.stderr + done.stdout:
                failures.append(f"{command!r} -> exit {done.returncode}: {(done.stderr or done.stdout)[-400:]}")
    listed = subprocess.run([sys.executable, "-m", "trainguard", "ps", "--json"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    for run in json.loads(listed.stdout or "[]"):
        if run["state"] in ("running", "restarting"):
            subprocess.run([sys.executable, "-m", "trainguard", "stop", run["id"], "--grace", "1s"], cwd=work,
                           env=env, capture_output=True, timeout=60, check=False)  # fmt: skip
    assert ran, f"no command found in {page}"
    assert not failures, "\n".join(failures)
    assert all(reason for reason in elsewhere.values()), elsewhere


def _missing_program(line: str, env: dict[str, str]) -> str | None:
    """A job whose launcher is not installed here (deepspeed without its extra): listed, not failed."""
    job = line.split(" -- ", 1)[1].split() if " -- " in line else []
    if job and shutil.which(job[0], path=env["PATH"]) is None:
        return f"{job[0]} is not installed here"
    return None


def _stop_examples_before(work: Path, env: dict[str, str]) -> None:
    """Each framework's example is its own project: a reader trying the next one has stopped the last
    (two live runs in one checkpoint folder are refused, as they should be)."""
    listed = subprocess.run([sys.executable, "-m", "trainguard", "ps", "--json"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    for run in json.loads(listed.stdout or "[]"):
        if run["state"] in ("running", "restarting") and run.get("name") != "vit":
            subprocess.run([sys.executable, "-m", "trainguard", "stop", run["id"], "--grace", "1s"], cwd=work,
                           env=env, capture_output=True, timeout=60, check=False)  # fmt: skip


def _run(command: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    long_running = " exporter" in command or " -f" in command.split("#")[0] or "--follow" in command
    if not long_running:
        if re.match(r"trainguard run .*--checkpoint-dir", command):
            _stop_examples_before(work, env)
        if re.search(r"\bstop\b", command):  # stop needs something to stop: the reader's run is running
            subprocess.run([sys.executable, "-m", "trainguard", "restart", "vit"], cwd=work, env=env,
                           capture_output=True, timeout=60, check=False)  # fmt: skip
        return subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
    # Following and serving never end by themselves: a person presses Ctrl+C after a while.
    process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    time.sleep(4)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    code = 0 if process.returncode in (0, 130, -signal.SIGINT) else process.returncode
    return subprocess.CompletedProcess(command, code, out, err)
