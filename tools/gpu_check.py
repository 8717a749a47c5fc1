"""One prepared check of trainguard's GPU paths, for a machine with an NVIDIA GPU (run it when a
device is lent; it prints one JSON report and exits 1 if a check failed):

    python tools/gpu_check.py > gpu-report.json

1. `trainguard doctor --json`: the NVML checks on real hardware.
2. The sampler's GPU readings (memory, utilisation, temperature, power, throttle reasons).
3. A real CUDA out-of-memory (torch.cuda.set_per_process_memory_fraction makes it cheap), diagnosed
   from its own traceback, and `adaptive_batch` surviving it by halving the micro-batch.
4. A checkpoint of CUDA tensors through the pinned staging buffer, loaded back equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import traceback


def main() -> int:
    import torch

    from trainguard._script import ScriptError

    if not torch.cuda.is_available():
        raise ScriptError("no CUDA GPU here: this script checks the GPU paths on a machine with one")
    report: dict = {}
    doctor = subprocess.run(
        [sys.executable, "-m", "trainguard", "doctor", "--json"], capture_output=True, text=True, check=False
    )
    report["doctor"] = json.loads(doctor.stdout) if doctor.stdout else doctor.stderr

    from trainguard.monitor.sampler import Sampler

    report["sample"] = Sampler(disk_paths=[]).sample(None).to_dict()

    import torch

    from trainguard import Checkpointer, adaptive_batch
    from trainguard.postmortem import LogSource, investigate

    torch.cuda.set_per_process_memory_fraction(0.05)
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")
        report["real_oom"] = "no OOM raised"
    except torch.cuda.OutOfMemoryError:
        text = traceback.format_exc()
        diagnosis = investigate([LogSource(None, [text.encode()])]).diagnosis
        report["real_oom"] = {"cause": diagnosis.cause, "confidence": diagnosis.confidence}
    torch.cuda.empty_cache()

    per_sample = int(total * 0.05 / 6)  # a micro-batch of 8 does not fit, 4 does

    def micro_step(micro, weight):
        torch.empty(len(micro) * per_sample, dtype=torch.uint8, device="cuda")
        return len(micro)

    with tempfile.TemporaryDirectory() as folder:
        step = adaptive_batch(micro_step, batch_size=16, state_dir=folder)
        done = step(torch.zeros(16))
        report["adaptive_batch"] = {"micro_batch": step.micro_batch, "samples": sum(done), "ooms": step.oom_count}

        state = {"w": torch.randn(1 << 20, device="cuda"), "step": 3}
        with Checkpointer(folder, handle_signals=False) as ckpt:
            ckpt.save(state, 3)
            ckpt.wait()
            loaded = ckpt.load_latest(map_location=None)
            pinned = bool(ckpt._staging and ckpt._staging.pinned)
        equal = bool(torch.equal(loaded["w"], state["w"]))
        report["gpu_checkpoint"] = {"equal": equal, "device": str(loaded["w"].device), "pinned_staging": pinned}
    print(json.dumps(report, indent=2, default=str))
    failed = (
        isinstance(report["real_oom"], str)
        or report["real_oom"]["cause"] != "cuda_oom"
        or report["adaptive_batch"]["samples"] != 16
        or not report["gpu_checkpoint"]["equal"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    from trainguard._script import run_script

    run_script(main)
