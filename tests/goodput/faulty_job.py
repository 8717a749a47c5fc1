"""A training job for the goodput tests: a Checkpointer saving every --save-every steps (5; 0: no
Checkpointer, the steps reported through trainguard.progress only), a step every --step-seconds,
each step printed. On attempt --oom-attempt it allocates memory after printing step --oom-step until
its memory cgroup's OOM killer ends it (the step's work is never saved); on attempt --hang-attempt it
falls silent after printing --hang-step; the test SIGKILLs another attempt from outside. It saves on a stop signal unless --no-save-on-stop: then the signal kills it
unsaved, as a stop that kills the DataLoader workers first does.

    python faulty_job.py --steps 50 --step-seconds 0.1 --oom-attempt 2 --oom-step 32
"""

from __future__ import annotations

import argparse
import os
import time

from trainguard import Checkpointer, progress


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--no-save-on-stop", action="store_true")
    parser.add_argument("--oom-attempt", type=int, default=0)
    parser.add_argument("--oom-step", type=int, default=-1)
    parser.add_argument("--hang-attempt", type=int, default=0)
    parser.add_argument("--hang-step", type=int, default=-1)
    args = parser.parse_args()
    attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "1"))
    ckpt = None
    if args.save_every:
        ckpt = Checkpointer(every=None, every_steps=args.save_every, keep=2, handle_signals=not args.no_save_on_stop)
    state = ckpt.load_latest() if ckpt else None
    start = state["step"] + 1 if state else 0
    if state:
        print(f"resumed from step {state['step']}", flush=True)
    total = state["total"] if state else 0.0
    for step in range(start, args.steps):
        time.sleep(args.step_seconds)
        total += step
        print(f"step {step}", flush=True)
        if attempt == args.oom_attempt and step == args.oom_step:
            hog = []
            while True:
                hog.append(bytearray(32 * 1024 * 1024))
        if attempt == args.hang_attempt and step == args.hang_step:
            time.sleep(1e6)  # silent, its last step's work never saved
        if ckpt is None:
            progress.report_step(step)
        elif ckpt.maybe_save(step, lambda: {"step": step, "total": total}) and ckpt.stop_requested:
            print(f"stopped after saving step {step}", flush=True)
            break
    if ckpt:
        ckpt.close()
    print(f"done total {total}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
