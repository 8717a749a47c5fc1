"""Record real checkpoint folders, written by the frameworks' own saving code, as listings for the
layout rules' unit tests (tests/data/layouts/*.json): every file's path, size and what trainguard
reads from inside it. Needs the `frameworks` and `deepspeed` extras; runs on CPU in about a minute.

    python tools/record_layouts.py            # rewrites tests/data/layouts/
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from trainguard.checkpoint.layouts import listing

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "layouts"

HF = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16))
data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(64)]
args = TrainingArguments(output_dir=OUT, max_steps=6, save_steps=3, per_device_train_batch_size=4,
                         report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no")
Trainer(model=model, args=args, train_dataset=data).train()
# A sharded save, as save_pretrained writes it for a big model, beside the Trainer's own files.
model.save_pretrained(OUT + "/sharded", max_shard_size="8KB")
"""

LIGHTNING = """
import torch, lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, i):
        return self.layer(batch).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
torch.manual_seed(0)
data = torch.utils.data.DataLoader(torch.randn(32, 8), batch_size=4)
ckpt = ModelCheckpoint(dirpath=OUT, every_n_train_steps=3, save_top_k=-1, save_last=True)
L.Trainer(max_steps=6, callbacks=[ckpt], logger=False, enable_progress_bar=False, accelerator="cpu",
          default_root_dir=OUT).fit(M(), data)
"""

ACCELERATE = """
import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration
class Step:
    def __init__(self): self.step = 0
    def state_dict(self): return {"step": self.step}
    def load_state_dict(self, d): self.step = d["step"]
acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=OUT, automatic_checkpoint_naming=True))
model = torch.nn.Linear(8, 1); opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
model, opt, sched = acc.prepare(model, opt, sched)
counter = Step(); acc.register_for_checkpointing(counter)
for counter.step in range(4):
    acc.backward(model(torch.randn(4, 8)).pow(2).mean()); opt.step(); sched.step(); opt.zero_grad()
    if counter.step % 2 == 1:
        acc.save_state()
"""

DEEPSPEED = """
import os, torch, deepspeed
for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
    os.environ.setdefault(key, value)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": STAGE},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
for step in range(4):
    engine.backward(engine(torch.randn(4, 8)).pow(2).mean()); engine.step()
    if step % 2 == 1:
        engine.save_checkpoint(OUT)
"""


def run(code: str, out: Path, *, ranks: int = 1, port: int = 29561, **subst: object) -> None:
    body = textwrap.dedent(code).replace("OUT", repr(str(out)))
    for key, value in subst.items():
        body = body.replace(key, repr(value))
    script = out.parent / f"make_{out.name}.py"  # not lightning.py: it would shadow the package
    script.write_text(body)
    if ranks > 1:
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", f"--master_port={port}",
                str(script)]  # fmt: skip
    else:
        argv = [sys.executable, str(script)]
    env = dict(os.environ, MASTER_PORT=str(port))
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)


def record(folder: Path, name: str) -> None:
    entries = sorted(listing(folder), key=lambda e: e.path)
    rows = [{"path": e.path, "is_dir": e.is_dir, "size": e.size, "mtime": round(e.mtime, 3), "facts": dict(e.facts)}
            for e in entries]  # fmt: skip
    (OUT / f"{name}.json").write_text(json.dumps({"source": name, "entries": rows}, indent=1) + "\n")
    print(f"{name}: {len(rows)} entries")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        run(HF, base / "hf")
        record(base / "hf", "hf_trainer")
        run(LIGHTNING, base / "lightning")
        record(base / "lightning", "lightning_modelcheckpoint")
        run(ACCELERATE, base / "accelerate")
        record(base / "accelerate", "accelerate_save_state")
        run(DEEPSPEED, base / "ds0", STAGE=0)
        record(base / "ds0", "deepspeed_stage0_1rank")
        run(DEEPSPEED, base / "ds2", ranks=2, STAGE=2)
        record(base / "ds2", "deepspeed_zero2_2ranks")
        run(DEEPSPEED, base / "ds3", ranks=2, STAGE=3, port=29562)
        record(base / "ds3", "deepspeed_zero3_2ranks")


if __name__ == "__main__":
    from trainguard._script import run_script

    run_script(main)
