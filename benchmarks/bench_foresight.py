"""Saving ahead of deaths seen coming (issue 20), each figure against a baseline measured in the same run:

1. a leak: a job leaking 20 MB/s under `--memory-limit 700M` with `Checkpointer(every="1h")`; steps lost
   at its first death with the save request reaching the job, against the same job that never sees it
   (`env -u TRAINGUARD_SAVE_REQUEST_FILE`: what every peer does)                    (goal <= 1 step)
2. a checkpoint disk (64 MB tmpfs) filling at 4 MB/s: steps lost when it is full, same two ways
                                                                    (goal: the last save completes)
3. goodput of every="auto" against fixed intervals of 1 min and 1 h, on one timeline with the demo's
   faults; the save cost is measured from real saves of this machine, the period is what the
   library's own every="auto" code chooses from the run's history (a simulated timeline: hours of
   real training do not fit in a benchmark)
4. false alarms: a job whose memory rises and falls each epoch for --minutes (10) under its limit:
   save requests and restarts                                                              (goal: 0)

    sudo python benchmarks/bench_foresight.py [--minutes 10] [--skip leak,disk,goodput,epochs]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

LEAKING_JOB = """
import os, time
from trainguard import Checkpointer
ckpt = Checkpointer(every="1h")
state = ckpt.load_latest()
start = state["step"] + 1 if state else 0
kept = []
for step in range(start, 100_000):
    kept.append(bytearray(b"x") * (2 << 20))  # 2 MB a 0.1 s step: 20 MB/s
    time.sleep(0.1)
    with open(os.environ["STEPS_LOG"], "a") as steps:
        steps.write(f"{os.environ['TRAINGUARD_ATTEMPT']} {step}\\n")
    ckpt.maybe_save(step, lambda: {"step": step})
    if ckpt.stop_requested:
        break
"""

FILLING_JOB = """
import os, sys, time
from trainguard import Checkpointer
ckpt = Checkpointer(every="1h")
with open(os.path.join(sys.argv[1], "dataset-cache.bin"), "ab") as cache:
    for step in range(100_000):
        cache.write(b"x" * (400 << 10))  # 4 MB/s of the disk's 64 MB
        cache.flush()
        time.sleep(0.1)
        ckpt.maybe_save(step, lambda: {"step": step, "weights": b"w" * (2 << 20)})
"""

EPOCHS_JOB = """
import sys, time
from trainguard import Checkpointer
ckpt = Checkpointer(every="1h")
deadline = time.time() + float(sys.argv[1])
epoch = 0
while time.time() < deadline:
    batch = []
    for step in range(50):
        batch.append(bytearray(b"x") * (6 << 20))  # up to 300 MB of a 700 MB limit, then freed
        time.sleep(0.1)
        ckpt.maybe_save(epoch * 50 + step, lambda: {"epoch": epoch})
    del batch
    epoch += 1
"""

WITHOUT_REQUESTS = ["env", "-u", "TRAINGUARD_SAVE_REQUEST_FILE"]


def trainguard(home: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {}), "TRAINGUARD_HOME": str(home)}, check=False)  # fmt: skip


def attempts(home: Path, name: str) -> list[dict]:
    return json.loads(trainguard(home, "status", name, "--json").stdout)["attempts"]


def events(home: Path, name: str, kind: str) -> int:
    run_id = json.loads(trainguard(home, "status", name, "--json").stdout)["id"]
    with sqlite3.connect(home / "runs.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM events WHERE run_id = ? AND kind = ?", (run_id, kind)).fetchone()[0]


def leak(work: Path, with_requests: bool) -> tuple[int, str]:
    """Steps lost at the first death and its cause."""
    home, steps = work / "home", work / "steps.log"
    job = work / "leak.py"
    job.write_text(LEAKING_JOB)
    prefix = [] if with_requests else WITHOUT_REQUESTS
    trainguard(home, "run", "--foreground", "--name", "leak", "--memory-limit", "700M", "--max-restarts", "1",
               "--", *prefix, sys.executable, str(job), env={"STEPS_LOG": str(steps)})  # fmt: skip
    trained: dict[int, list[int]] = {}
    for line in steps.read_text().splitlines():
        attempt, step = map(int, line.split())
        trained.setdefault(attempt, []).append(step)
    lost = max(trained[1]) + 1 - min(trained.get(2, [0]))
    return lost, attempts(home, "leak")[0]["cause"]


def filling_disk(work: Path, with_requests: bool) -> tuple[int, str]:
    """Steps lost when the checkpoint disk is full (all of them without a checkpoint) and the cause."""
    disk, home = work / "disk", work / "home"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
    try:
        job = work / "fill.py"
        job.write_text(FILLING_JOB)
        prefix = [] if with_requests else WITHOUT_REQUESTS
        trainguard(home, "run", "--foreground", "--name", "fill", "--max-restarts", "0", "--checkpoint-dir",
                   str(disk / "ckpt"), "--", *prefix, sys.executable, str(job), str(disk))  # fmt: skip
        attempt = attempts(home, "fill")[0]
        saved = [json.loads(path.read_text())["step"] for path in (disk / "ckpt").glob("step-*/manifest.json")]
        died = attempt["step"] or 0
        return died + 1 - (max(saved) + 1 if saved else 0), attempt["cause"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def measured_save_cost(work: Path, megabytes: int = 256) -> float:
    """What one periodic save of a `megabytes` state blocks the training loop, on this machine."""
    code = textwrap.dedent(f"""
        import time
        from trainguard import Checkpointer
        state = {{"weights": bytearray({megabytes} << 20)}}
        with Checkpointer({str(work / "cost")!r}, every=None, keep=1, handle_signals=False) as ckpt:
            costs = []
            for step in range(3):
                started = time.perf_counter()
                ckpt.save(state, step)
                costs.append(time.perf_counter() - started)
                ckpt.wait()
        print(sorted(costs)[1])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def goodput(save_cost_s: float, every: str, deaths: list[float], hours: float, restart_s: float = 60.0) -> float:
    """The share of a `hours`-long run's time that is kept training, with deaths at `deaths` (hours into
    it), saving every `every` ("auto": the library's own choice, from this run's history as the
    supervisor hands it over in TRAINGUARD_MTBF_S)."""
    from trainguard.checkpoint._schedule import SaveSchedule
    from trainguard.checkpoint.interval import AttemptRecord, estimate_mtbf

    end, now, kept, history = hours * 3600, 0.0, 0.0, []
    for death in [*sorted(d * 3600 for d in deaths), end]:
        started = now
        mtbf = estimate_mtbf(history, now=now).seconds
        clock = [now]
        schedule = SaveSchedule(every, None, sharded=False, clock=lambda: clock[0],
                                environ={"TRAINGUARD_MTBF_S": str(mtbf)})  # fmt: skip
        trained_since_save = 0.0
        while True:
            period = schedule.every_s or float("inf")
            if clock[0] + period + save_cost_s > death:
                trained_since_save += death - clock[0]
                break
            clock[0] += period
            trained_since_save = 0.0
            kept += period
            schedule.saving(0)
            clock[0] += save_cost_s  # the save blocks training this long
            schedule.measured(save_cost_s)
        if death == end:
            kept += trained_since_save  # the run's end: the job saves what it trained
        history.append(AttemptRecord(started, death, None if death == end else "host_oom"))
        now = death + restart_s
    return kept / end


def false_alarms(work: Path, minutes: float) -> tuple[int, int]:
    home = work / "home"
    job = work / "epochs.py"
    job.write_text(EPOCHS_JOB)
    trainguard(home, "run", "--foreground", "--name", "epochs", "--memory-limit", "700M", "--", sys.executable,
               str(job), str(minutes * 60), timeout=minutes * 60 + 300)  # fmt: skip
    return events(home, "epochs", "save_ahead"), len(attempts(home, "epochs")) - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the epochs job of 4. runs")
    parser.add_argument("--skip", default="", help="comma-separated: leak, disk, goodput, epochs")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if os.geteuid() != 0 and not {"leak", "disk", "epochs"} <= skip:
        print("needs root: a memory cgroup (--memory-limit) and a tmpfs mount; or --skip leak,disk,epochs")
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-foresight-") as tmp:
        root = Path(tmp)
        cases = (("leak", "1. leak, steps lost at the first death", leak, "goal <= 1 step"),
                 ("disk", "2. filling checkpoint disk, steps lost", filling_disk, "goal: the last save completes"))
        for key, title, measure, goal in cases:
            if key in skip:
                continue
            (root / key / "with").mkdir(parents=True), (root / key / "without").mkdir()
            lost_with, cause_with = measure(root / key / "with", True)
            lost_without, cause_without = measure(root / key / "without", False)
            print(f"{title}: {lost_with} ({cause_with}) with the request, {lost_without} ({cause_without}) "
                  f"without; ratio {lost_with / max(1, lost_without):.3f}  ({goal})")
        if "goodput" not in skip:
            cost = measured_save_cost(root)
            # The demo's eight faults, six of them deaths that cost the work since the last save, over two days.
            deaths, hours = [3.1, 9.7, 14.2, 22.5, 31.0, 40.4], 48.0
            figures = {every: goodput(cost, every, deaths, hours) for every in ("auto", "1m", "1h")}
            print(f"3. goodput over {hours:g} h with {len(deaths)} deaths, a save blocking {cost:.2f} s: "
                  + ", ".join(f"every={every!r} {ratio:.4f}" for every, ratio in figures.items())
                  + f"; auto / 1m = {figures['auto'] / figures['1m']:.4f}, auto / 1h = {figures['auto'] / figures['1h']:.4f}")
        if "epochs" not in skip:
            (root / "e").mkdir()
            started = time.monotonic()
            requests, restarts = false_alarms(root / "e", args.minutes)
            print(f"4. epochs rising and falling for {(time.monotonic() - started) / 60:.1f} min: {requests} save "
                  f"requests, {restarts} restarts  (goal: 0 and 0)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
