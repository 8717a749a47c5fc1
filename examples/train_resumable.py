"""A plain PyTorch training script made resumable with trainguard's Checkpointer.

    python examples/train_resumable.py --steps 2000 --ckpt ckpt/
    # kill it (Ctrl+C, kill, a scheduler's SIGTERM) and start it again: it goes on where it stopped.
    trainguard run -- python examples/train_resumable.py --steps 2000   # (the folder comes from trainguard)
"""

from __future__ import annotations

import argparse

import torch

from trainguard import Checkpointer, capture_rng, restore_rng


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--ckpt", default=None, help="checkpoint folder (default: TRAINGUARD_CHECKPOINT_DIR)")
    parser.add_argument("--every", default="5m", help="save period, e.g. 90s, 30m, 1h")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    ckpt = Checkpointer(args.ckpt, every=args.every, keep=3)  # 1. where and how often
    state = ckpt.load_latest()  # 2. the newest complete checkpoint, or None
    start = 0
    if state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        restore_rng(state["rng"])
        start = state["step"] + 1
        print(f"resumed from step {state['step']}", flush=True)

    for step in range(start, args.steps):
        x = torch.randn(64, 32)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        # 3. saves every period, at once on SIGTERM/SIGUSR1; the lambda runs only when it saves
        ckpt.maybe_save(step, lambda: {"step": step, "model": model.state_dict(),
                                       "optim": optimizer.state_dict(), "rng": capture_rng()})  # fmt: skip
        if ckpt.stop_requested:  # 4. a scheduler asked us to stop and the state is saved
            print(f"stopping at step {step}: state saved", flush=True)
            return
    ckpt.save({"step": args.steps - 1, "model": model.state_dict(), "optim": optimizer.state_dict(), "rng": capture_rng()},
              args.steps - 1)  # fmt: skip
    ckpt.wait()
    print("done", flush=True)


if __name__ == "__main__":
    main()
