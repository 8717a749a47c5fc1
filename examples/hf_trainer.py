"""A Hugging Face Trainer that saves on SIGTERM/SIGUSR1 and resumes from its newest complete checkpoint.

    trainguard run --checkpoint-dir out -- python examples/hf_trainer.py --output-dir out

Two lines make a Trainer script preemption-safe under trainguard: the callback, and the checkpoint to
resume from. A tiny GPT-2 built from a config (no download), on CPU, with fixed seeds.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from trainguard.integrations.huggingface import TrainguardCallback, resume_from_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "out"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-steps", type=int, default=50)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, 128, (512, 32), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in tokens]

    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        save_steps=args.save_steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        seed=0,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_steps=25,
    )
    trainer = Trainer(model=model, args=training, train_dataset=data,
                      callbacks=[TrainguardCallback()])  # 1. save and stop on SIGTERM/SIGUSR1  # fmt: skip
    trainer.train(resume_from_checkpoint=resume_from_checkpoint(args.output_dir))  # 2. newest complete one

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    print(f"finished at step {trainer.state.global_step} weights {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
