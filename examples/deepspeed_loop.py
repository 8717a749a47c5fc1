"""A DeepSpeed training loop that saves on SIGTERM/SIGUSR1 and resumes from its newest complete tag.

    trainguard run --checkpoint-dir ckpt -- python examples/deepspeed_loop.py --dir ckpt

A tiny model with ZeRO stage 1, fixed seeds; it runs on CPU (DeepSpeed's CPU accelerator) as one
process when no launcher set the distributed environment. Batch i is a function of i, and the step
travels in DeepSpeed's client state.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import deepspeed
import torch

from trainguard.integrations.deepspeed import PreemptionGuard, load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "ckpt"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--local_rank", type=int, default=0)  # set by the deepspeed launcher
    args = parser.parse_args()
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29500")):  # fmt: skip
        os.environ.setdefault(key, value)  # one process without a launcher

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())

    guard = PreemptionGuard()  # 1. SIGTERM/SIGUSR1 become "save at the end of this step, then stop"
    _, client = load_checkpoint(engine, args.dir)  # 2. the newest complete tag, never a cut one
    start = client["step"] + 1 if client else 0
    if client:
        guard.resumed(client["step"])
    for step in range(start, args.steps):
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(dim=1, keepdim=True))
        engine.backward(loss)
        engine.step()
        save = lambda: engine.save_checkpoint(args.dir, client_state={"step": step})  # noqa: E731
        if (step + 1) % args.every == 0:
            save()
        if guard.step_end(step, save=save):  # 3. saved on a signal: leave
            return

    digest = hashlib.sha256()
    for name, tensor in sorted(engine.module.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    print(f"finished at step {args.steps} weights {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
