"""An Accelerate training loop that saves on SIGTERM/SIGUSR1 and resumes from its newest complete state.

    trainguard run --checkpoint-dir out -- python examples/accelerate_loop.py --project-dir out

A tiny model on CPU with fixed seeds; the step counter is saved with the state
(``register_for_checkpointing``), and batch i is a function of i, so a resumed run sees the same data.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed

from trainguard.integrations.accelerate import PreemptionGuard, load_state


class Progress:
    """The next step to run, saved and restored with the rest of the state."""

    def __init__(self) -> None:
        self.next_step = 0

    def state_dict(self) -> dict:
        return {"next_step": self.next_step}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = state["next_step"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project-dir", default=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "out"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=200)
    args = parser.parse_args()

    set_seed(0)
    project = ProjectConfiguration(project_dir=args.project_dir, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=project)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / args.steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    done = Progress()
    accelerator.register_for_checkpointing(done)

    guard = PreemptionGuard()  # 1. SIGTERM/SIGUSR1 become "save at the end of this step, then stop"
    if load_state(accelerator):  # 2. the newest complete checkpoint, if any
        guard.resumed(done.next_step - 1)
    for step in range(done.next_step, args.steps):
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        done.next_step = step + 1
        if (step + 1) % args.every == 0:
            accelerator.save_state()
        if guard.step_end(step, save=accelerator.save_state):  # 3. saved on a signal: leave
            return

    digest = hashlib.sha256()
    for name, tensor in sorted(accelerator.unwrap_model(model).state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    print(f"finished at step {args.steps} weights {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
