"""The demo's training job: a small linear model fitted by SGD in plain Python (no torch or NumPy
needed), checkpointed with trainguard's Checkpointer, with one real fault injected on attempt 1.

    python -m trainguard.demo.toyjob --steps 30 --fault NAME
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

from trainguard import Checkpointer

FAULTS = ("none", "host_oom", "shm", "preempted", "hang", "disk_full", "python_error")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--fault-step", type=int, default=12)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    args = parser.parse_args()
    first_attempt = os.environ.get("TRAINGUARD_ATTEMPT", "1") == "1"

    ckpt = Checkpointer(every=None, every_steps=5, keep=2)
    state = ckpt.load_latest()
    rng = random.Random(0)
    weights = [0.0] * 8
    start = 0
    if state:
        weights, start = state["weights"], state["step"] + 1
        rng.setstate(state["rng"])
        print(f"resumed from step {state['step']}", flush=True)
    truth = [0.5 * (i + 1) for i in range(8)]
    for step in range(start, args.steps):
        x = [rng.uniform(-1, 1) for _ in truth]
        error = sum(w * v for w, v in zip(weights, x)) - sum(t * v for t, v in zip(truth, x))
        weights = [w - 0.1 * error * v for w, v in zip(weights, x)]
        print(f"step {step} loss {error * error:.5f}", flush=True)
        time.sleep(args.step_seconds)
        if first_attempt and step == args.fault_step:
            inject(args.fault)
        ckpt.maybe_save(step, lambda: {"step": step, "weights": weights, "rng": rng.getstate()})
        if ckpt.stop_requested:
            print(f"Received SIGTERM: state saved at step {step}", flush=True)
            ckpt.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)  # what the scheduler does after the grace period
    ckpt.close()
    print("training finished", flush=True)
    return 0


def inject(fault: str) -> None:
    if fault == "host_oom":
        hog = []
        while True:  # until the memory cgroup's limit: the kernel's OOM killer ends this
            hog.append(bytearray(16 * 1024 * 1024))
    elif fault == "preempted":
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's preemption notice; the Checkpointer saves
    elif fault == "hang":
        time.sleep(3600)  # a collective that never completes
    elif fault == "disk_full":
        folder = os.environ["TRAINGUARD_CHECKPOINT_DIR"]
        with open(os.path.join(folder, "optimizer-state.bin"), "wb") as out:
            out.write(b"\0" * (64 * 1024 * 1024))  # larger than the disk: OSError ENOSPC
    elif fault == "python_error":
        labels = {"cat": 0, "dog": 1}
        print(labels["bird"])
    elif fault == "shm":
        shm_dataloader()


def shm_dataloader() -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Images(Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int):
            return torch.ones(3, 256, 256)

    for batch in DataLoader(Images(), batch_size=8, num_workers=2):
        del batch


if __name__ == "__main__":
    sys.exit(main())
