"""Record real runs with known faults as goodput's test data (tests/data/goodput/*.json): each
attempt as the registry holds it (times, cause, resumed_from, what the job reported) and the
checkpoints the supervisor recorded, with what happened (the steps each attempt printed, the step
each resumed from) read from the logs, and when it was recorded (a running run's "now"). The
out-of-memory scenario needs root (a memory cgroup); all of them take about two minutes.

    python tools/record_goodput.py                    # rewrites tests/data/goodput/
    python tools/record_goodput.py no_progress_job    # only the scenarios named
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
            "exit_code": a.exit_code, "signal": a.signal, "resumed_from": a.resumed_from,
            "progress": {k: v for k, v in (a.progress or {}).items() if k not in ("saves", "pid", "rank")},
            "printed_steps": [min(printed), max(printed)] if printed else None,
            "log_resumed_step": int(resumed.group(1)) if resumed else None,
        })  # fmt: skip
    checkpoints = [{"time": e["time"], "step": e.get("step"), "path": e.get("path")}
                   for e in registry.events(record.id) if e["kind"] == "checkpoint"]  # fmt: skip
    decisions = [{"time": e["time"], "delay_s": e["delay_s"]} for e in registry.events(record.id)
                 if e["kind"] == "decision"]  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    data = {"note": note, "state": record.state, "recorded_at": time.time(), "attempts": attempts,
            "checkpoints": checkpoints, "decisions": decisions}  # fmt: skip
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"{name}: {record.state}, {len(attempts)} attempts, {len(checkpoints)} checkpoints")


def job(*args: str) -> list[str]:
    return [sys.executable, str(JOB), *args]


def sigkill_then_cgroup_oom(home: Path, tmp: Path) -> None:
    trainguard(home, "run", "--name", "kill_oom", "--memory-limit", "300M", "--", *job("--steps", "50"),
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


def hang_stopped_job(home: Path, tmp: Path) -> None:
    trainguard(home, "run", "--name", "hang", "--hang-timeout", "2s", "--grace", "1s", "--", *job("--steps", "30"))
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


def own_files_sigkill(home: Path, tmp: Path) -> None:
    script = tmp / "own_files.py"
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


def stop_after_step_30(home: Path, run: str, save_every: int, name: str, note: str) -> None:
    trainguard(home, "run", "--name", run, "--", *job("--steps", "1000", "--save-every", str(save_every)))
    wait_for_line(status(home, run)["attempts"][-1]["log_path"], r"^step 30$")
    trainguard(home, "stop", run)
    wait_ended(home, run)
    dump(home, run, name, f"{note}, stopped with `trainguard stop` after printing step 30. A step takes 0.1 s.")


def stopped_without_checkpoint(home: Path, tmp: Path) -> None:
    stop_after_step_30(home, "nockpt", 0, "stopped_without_checkpoint",
                       "a job reporting its steps (trainguard.progress) and saving nothing: the stop signal "
                       "ends it")  # fmt: skip


def stopped_after_saving(home: Path, tmp: Path) -> None:
    stop_after_step_30(home, "savestop", 100, "stopped_after_saving",
                       "a Checkpointer saving every 100 steps: on SIGTERM it saves the step it is at and leaves "
                       "its loop")  # fmt: skip


def stop_unsaved_foreground(home: Path, tmp: Path) -> None:
    def foreground() -> subprocess.Popen:
        env = {**os.environ, "TRAINGUARD_HOME": str(home)}
        return subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--foreground", "--name", "fg", "--",
                                 *job("--steps", "600", "--step-seconds", "0.02", "--save-every", "200",
                                      "--no-save-on-stop")], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip

    supervisor = foreground()
    deadline = time.monotonic() + 60
    while not (logs := sorted(home.glob("runs/*/attempt-1.log"))) and time.monotonic() < deadline:
        time.sleep(0.02)
    wait_for_line(str(logs[0]), r"^step 342$")
    supervisor.send_signal(signal.SIGTERM)  # what Kubernetes sends the container's PID 1
    supervisor.wait(timeout=60)
    note = ("`trainguard run --foreground` of a Checkpointer saving every 200 steps (0.02 s a step) whose stop "
            "signal ends it unsaved (as a stop that kills its DataLoader workers does); SIGTERM to trainguard "
            "after the job printed step 342, 143 steps after its newest checkpoint (199)")  # fmt: skip
    dump(home, "fg", "stop_unsaved", note + ".")
    foreground().wait(timeout=120)  # the same command again (the pod restarted): continues the run in place
    dump(home, "fg", "stop_unsaved_continued", note + "; the same command again continues the run in place from "
         "step 199 and finishes step 599.")  # fmt: skip


def running_after_a_checkpoint(home: Path, tmp: Path) -> None:
    trainguard(home, "run", "--name", "live", "--", *job("--steps", "1000", "--save-every", "50"))
    wait_for_line(status(home, "live")["attempts"][-1]["log_path"], r"^step 80$")
    dump(
        home,
        "live",
        "running_after_a_checkpoint",
        "a Checkpointer saving every 50 steps, recorded while it runs, after it printed step 80 (newest "
        "checkpoint 49); `recorded_at` is when. A step takes 0.1 s.",
    )
    trainguard(home, "stop", "live")
    wait_ended(home, "live")


def no_progress_job(home: Path, tmp: Path) -> None:
    trainguard(home, "run", "--name", "silent", "--", sys.executable, "-c", "import time; time.sleep(3)")
    wait_ended(home, "silent")
    dump(home, "silent", "no_progress_job", "a job that reports no steps and saves no checkpoint: it sleeps 3 s.")


SCENARIOS = {f.__name__: f for f in (sigkill_then_cgroup_oom, hang_stopped_job, own_files_sigkill,
                                     stopped_without_checkpoint, stopped_after_saving, stop_unsaved_foreground,
                                     running_after_a_checkpoint, no_progress_job)}  # fmt: skip
NEEDS_ROOT = {"sigkill_then_cgroup_oom"}  # its out-of-memory kill uses a memory cgroup


def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        print(f"record_goodput: no scenario {', '.join(unknown)} (there are: {', '.join(SCENARIOS)})", file=sys.stderr)
        return 2
    if NEEDS_ROOT & set(names) and os.geteuid() != 0:
        print("record_goodput: needs root (the out-of-memory scenario uses a memory cgroup)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            SCENARIOS[name](Path(tmp) / name / "state", Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
