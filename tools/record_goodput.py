"""Record real runs with known faults as goodput's test data (tests/data/goodput/*.json): each
attempt as the registry holds it (times, cause, resumed_from, what the job reported) and the
checkpoints the supervisor recorded, with what happened (the steps each attempt printed, the step
each resumed from) read from the logs. Needs root (a memory cgroup); about a minute.

    python tools/record_goodput.py            # rewrites tests/data/goodput/
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "goodput"
JOB = ROOT / "tests" / "goodput" / "faulty_job.py"

# A job without trainguard's library: saves its own file every second, resumes from --resume.
OWN_FILES = textwrap.dedent("""
    import argparse, os, time
    parser = argparse.ArgumentParser(); parser.add_argument("--resume"); args = parser.parse_args()
    folder = os.environ["TRAINGUARD_CHECKPOINT_DIR"]
    epoch = int(open(args.resume).read()) + 1 if args.resume else 0
    while epoch < 12:
        time.sleep(0.5); print(f"epoch {epoch}", flush=True)
        with open(os.path.join(folder, f"tmp-{epoch}"), "w") as out: out.write(str(epoch))
        os.replace(os.path.join(folder, f"tmp-{epoch}"), os.path.join(folder, f"epoch-{epoch:03d}.txt"))
        epoch += 1
""")


def trainguard(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINGUARD_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "trainguard", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def status(home: Path, run: str) -> dict:
    return json.loads(trainguard(home, "status", run, "--json").stdout)


def wait_for_line(path: str, pattern: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if re.search(pattern, Path(path).read_text(), re.MULTILINE):
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{pattern!r} never appeared in {path}")


def wait_ended(home: Path, run: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = status(home, run)
        if info["state"] in ("succeeded", "failed", "stopped"):
            return info
        time.sleep(0.3)
    raise TimeoutError(f"run {run} did not end")


def kill_attempt(home: Path, run: str, line: str) -> None:
    info = status(home, run)
    wait_for_line(info["attempts"][-1]["log_path"], line)
    os.kill(info["pid"], signal.SIGKILL)


def dump(home: Path, run: str, name: str, note: str) -> None:
    from trainguard.store.registry import Registry

    registry = Registry(home)
    record = registry.resolve(run)
    attempts = []
    for a in record.attempts:
        log = Path(a.log_path).read_text() if a.log_path and Path(a.log_path).exists() else ""
        printed = [int(m) for m in re.findall(r"^(?:step|epoch) (\d+)$", log, re.MULTILINE)]
        resumed = re.search(r"^resumed from step (\d+)$", log, re.MULTILINE)
        attempts.append({
            "n": a.n, "started_at": a.started_at, "ended_at": a.ended_at, "cause": a.cause,
            "resumed_from": a.resumed_from,
            "progress": {k: v for k, v in (a.progress or {}).items() if k not in ("saves", "pid", "rank")},
            "printed_steps": [min(printed), max(printed)] if printed else None,
            "log_resumed_step": int(resumed.group(1)) if resumed else None,
        })  # fmt: skip
    checkpoints = [{"time": e["time"], "step": e.get("step"), "path": e.get("path")}
                   for e in registry.events(record.id) if e["kind"] == "checkpoint"]  # fmt: skip
    decisions = [{"time": e["time"], "delay_s": e["delay_s"]} for e in registry.events(record.id)
                 if e["kind"] == "decision"]  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    data = {"note": note, "state": record.state, "attempts": attempts, "checkpoints": checkpoints,
            "decisions": decisions}  # fmt: skip
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"{name}: {record.state}, {len(attempts)} attempts, {len(checkpoints)} checkpoints")


def main() -> int:
    if os.geteuid() != 0:
        print("record_goodput: needs root (the out-of-memory scenario uses a memory cgroup)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "state"
        job = [sys.executable, str(JOB), "--steps", "50", "--step-seconds", "0.1"]
        trainguard(home, "run", "--name", "kill_oom", "--memory-limit", "300M", "--", *job,
                   "--oom-attempt", "2", "--oom-step", "32")  # fmt: skip
        kill_attempt(home, "kill_oom", r"^step 22$")
        wait_ended(home, "kill_oom")
        dump(
            home,
            "kill_oom",
            "sigkill_then_cgroup_oom",
            "attempt 1 SIGKILLed from outside after printing step 22 (checkpoints every 5 steps: 19 is the newest); "
            "attempt 2 OOM-killed by its 300M memory cgroup after printing step 32 (newest checkpoint 29); "
            "attempt 3 finishes step 49. A step takes 0.1 s.",
        )
        trainguard(home, "run", "--name", "hang", "--hang-timeout", "2s", "--grace", "1s", "--", *job[:-4],
                   "--steps", "30", "--step-seconds", "0.1")  # fmt: skip
        info = status(home, "hang")
        wait_for_line(info["attempts"][-1]["log_path"], r"^step 12$")
        os.kill(info["pid"], signal.SIGSTOP)  # a job frozen mid-training: the watchdog finds it after 2 s
        wait_ended(home, "hang")
        dump(
            home,
            "hang",
            "hang_stopped_job",
            "attempt 1 SIGSTOPped after printing step 12 (newest checkpoint 9); the 2 s hang watchdog stops it "
            "(SIGTERM, SIGKILL after the 1 s grace); "
            "attempt 2 finishes step 29. A step takes 0.1 s.",
        )
        script = Path(tmp) / "own_files.py"
        script.write_text(OWN_FILES)
        trainguard(home, "run", "--name", "own", "--checkpoint-glob", "epoch-*.txt", "--resume-arg",
                   "--resume {checkpoint}", "--", sys.executable, str(script))  # fmt: skip
        kill_attempt(home, "own", r"^epoch 5$")
        wait_ended(home, "own")
        dump(
            home,
            "own",
            "own_files_sigkill",
            "a job without trainguard's library saving epoch-N.txt every 0.5 s, SIGKILLed after epoch 5 "
            "(its newest file: epoch 5 or 4); attempt 2 resumes from that file and finishes epoch 11.",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
