"""Reproducing the failures trainguard names, for real: a memory cgroup the kernel OOM-kills in, a
private mount namespace with a 1 MB /dev/shm, a tiny tmpfs, a closed pty. Each helper says why it
cannot run (not root, no cgroup controller) so the test skips with that reason."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")

# A DataLoader whose workers pass 3x256x256 float batches through /dev/shm (needs torch).
DATALOADER_JOB = """
import torch
from torch.utils.data import DataLoader, Dataset

class Images(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, index):
        return torch.ones(3, 256, 256)

for step, batch in enumerate(DataLoader(Images(), batch_size=8, num_workers=2)):
    print(f"step {step} batch {tuple(batch.shape)}", flush=True)
"""
CGROUP_V2 = Path("/sys/fs/cgroup")

# Checkpoints every step and, in its first attempt only, eats memory from step 5 until a memory limit
# kills it: the next attempt resumes from step 5 and finishes at step 11.
OOM_ONCE_JOB = """
    import os
    from trainguard import Checkpointer
    ckpt = Checkpointer(every=None, every_steps=1)
    state = ckpt.load_latest()
    start = state["step"] + 1 if state else 0
    print("attempt", os.environ["TRAINGUARD_ATTEMPT"], "resume", os.environ.get("TRAINGUARD_RESUME_FROM"), flush=True)
    for step in range(start, 12):
        ckpt.maybe_save(step, {"step": step})
        ckpt.wait()
        print("step", step, flush=True)
        if step == 5 and os.environ["TRAINGUARD_ATTEMPT"] == "1":
            hog = []
            while True:
                hog.append(bytearray(16 * 1024 * 1024))
    print("finished", flush=True)
"""


def why_no_root() -> str | None:
    return None if os.geteuid() == 0 else "needs root"


def why_no_memory_cgroup() -> str | None:
    if os.geteuid() != 0:
        return "a memory cgroup needs root"
    if (CGROUP_V1_MEMORY / "memory.limit_in_bytes").exists():
        return None
    if (
        "memory" in (CGROUP_V2 / "cgroup.controllers").read_text(errors="replace")
        if (CGROUP_V2 / "cgroup.controllers").exists()
        else False
    ):
        return None
    return "no memory cgroup controller (v1 or v2) on this machine"


@contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A fresh memory cgroup with a hard limit and no swap; yields the file to write a pid into."""
    name = f"trainguard-test-{uuid.uuid4().hex[:8]}"
    if (CGROUP_V1_MEMORY / "memory.limit_in_bytes").exists():
        group = CGROUP_V1_MEMORY / name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        with contextlib.suppress(OSError):  # no swap accounting: fine when the machine has no swap
            (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
    else:
        group = CGROUP_V2 / name
        group.mkdir()
        (group / "memory.max").write_text(str(limit_bytes))
        (group / "memory.swap.max").write_text("0")
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                subprocess.run(["sleep", "0.1"], check=False)


@contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def why_no_mount_namespace() -> str | None:
    if os.geteuid() != 0:
        return "a private mount namespace with its own /dev/shm needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.decode().strip()}"


def with_tiny_dev_shm(command: list[str], size: str = "1m") -> list[str]:
    """The command, run in a private mount namespace whose /dev/shm is a tmpfs of ``size``."""
    script = f'mount --make-rprivate / && mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'
    return ["unshare", "-m", "bash", "-c", script, "trainguard-tiny-shm", *command]


def run_to_log(command: list[str], log: Path, **kwargs) -> int:
    """Run a job the way people do, stdout and stderr into one log file; return its exit status."""
    with log.open("ab") as out:
        return subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, timeout=300, check=False, **kwargs
        ).returncode
