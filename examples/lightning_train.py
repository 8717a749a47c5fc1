"""A Lightning Trainer that saves on SIGTERM/SIGUSR1 (no Slurm needed) and resumes from its newest
complete checkpoint.

    trainguard run --checkpoint-dir ckpt -- python examples/lightning_train.py --dir ckpt

A tiny model on CPU with fixed seeds. The batches come from a loader with ``state_dict`` /
``load_state_dict``: Lightning restores it, so a run stopped mid-epoch goes on with the same data.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from trainguard.integrations.lightning import TrainguardCallback, ckpt_path


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class ResumableBatches:
    """Batch i is a function of i; the loader's position is saved in the checkpoint."""

    def __init__(self, batches: int, batch_size: int = 32) -> None:
        self.batches, self.batch_size = batches, batch_size
        self.position = 0

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        start = self.position if self.position < self.batches else 0  # a finished epoch starts over
        for index in range(start, self.batches):
            generator = torch.Generator().manual_seed(index)
            x = torch.randn(self.batch_size, 16, generator=generator)
            self.position = index + 1
            yield x, x.sum(dim=1, keepdim=True)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "ckpt"))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    model = Regression()
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ModelCheckpoint(dirpath=args.dir, every_n_train_steps=args.every, save_top_k=-1),
            TrainguardCallback(),  # 1. save and stop on SIGTERM/SIGUSR1
        ],
    )
    trainer.fit(model, ResumableBatches(batches=120), ckpt_path=ckpt_path(args.dir))  # 2. newest complete one

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    print(f"finished at step {trainer.global_step} weights {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
