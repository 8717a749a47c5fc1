"""A small data-parallel training job for real launchers on CPU (gloo): every rank computes gradients
on its own batch, the gradients are averaged (all_reduce), every rank saves its shard through
``Checkpointer`` and resumes from the step that is complete for every rank. Faults are injected on
one rank of the first attempt: FAULT=raise|oom|hang|kill, FAULT_RANK (-1: any rank, for a fault set on
one node only), FAULT_STEP. Each rank prints when its first step of an attempt is done (training again)."""

TRAIN = r"""
import os, sys, time
import torch
import torch.distributed as dist
from trainguard import Checkpointer

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = os.environ["TRAINGUARD_ATTEMPT"]
total = int(os.environ.get("TOTAL_STEPS", "30"))
torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optim = torch.optim.SGD(model.parameters(), lr=0.05)
ckpt = Checkpointer(every=None, every_steps=5)
state = ckpt.load_latest()
start = 0
if state:
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    start = state["step"] + 1
print(f"rank {rank} attempt {attempt} starts at step {start} at {time.time():.3f}", flush=True)
fault, fault_rank, fault_step = os.environ.get("FAULT"), int(os.environ.get("FAULT_RANK", "1")), int(os.environ.get("FAULT_STEP", "12"))
for step in range(start, total):
    data = torch.randn(32, 16, generator=torch.Generator().manual_seed(1000 * step + rank))
    loss = (model(data) - data.sum(dim=1, keepdim=True)).pow(2).mean()
    optim.zero_grad()
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= world
    optim.step()
    if step == start:
        print(f"rank {rank} attempt {attempt} trains again at {time.time():.3f}", flush=True)
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    ckpt.maybe_save(step, lambda: {"step": step, "model": model.state_dict(), "optim": optim.state_dict()})
    if attempt == "1" and fault_rank in (rank, -1) and step == fault_step:
        if fault == "raise":
            raise ValueError(f"bad batch at step {step}")
        if fault == "oom":
            print("rank %d loads the whole dataset into memory" % rank, flush=True)
            hog = []
            while True:
                hog.append(torch.ones(16 * 1024 * 1024, dtype=torch.uint8))
        if fault == "hang":
            time.sleep(3600)
        if fault == "kill":
            os.kill(os.getpid(), 9)
    time.sleep(float(os.environ.get("STEP_SLEEP", "0.02")))
ckpt.close()
torch.save(model.state_dict(), os.path.join(os.environ["OUT_DIR"], f"final-rank{rank}.pt"))
print(f"rank {rank} finished", flush=True)
dist.destroy_process_group()
"""
