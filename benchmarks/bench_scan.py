"""Scan benchmark: `trainguard diagnose` against `LC_ALL=C grep -cE` over the same log, same run.

A realistic 256 MB training log (progress bars, per-step metrics, warnings, NCCL chatter) with a CUDA
OOM buried at 70% and the usual cascade after it. grep gets an alternation of the same signature
patterns (translated to POSIX ERE). Prints throughput, the ratio grep_time / trainguard_time (goal
>= 1.0) and trainguard's peak memory on a 256 MB and a 1 GB log (goal: well under 200 MB, flat).

    python benchmarks/bench_scan.py [--size-mb 256] [--no-big] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainguard.diagnosis.signatures import default_table  # noqa: E402

FAILURE = """[rank3]: Traceback (most recent call last):
[rank3]:   File "/workspace/train.py", line 311, in <module>
[rank3]:     loss.backward()
[rank3]:   File "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a total capacity of 79.19 GiB of which 1.02 GiB is free.
"""
CASCADE = """[rank0]:[E1129 02:47:21.715298746 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=91842, OpType=ALLREDUCE, NumelIn=86567656, NumelOut=86567656, Timeout(ms)=600000) ran for 600085 milliseconds before timing out.
W1129 02:47:23.102000 140213 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 140281 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def generate_log(path: Path, size: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    warnings = [
        "/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:295: UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
        "[rank{r}]: NCCL INFO Channel 03/24 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "[rank{r}]: W1129 02:13:55.41 torch/_dynamo/convert_frame.py:844] torch._dynamo hit config.cache_size_limit (8)",
        "wandb: WARNING Step must only increase in log calls. Step 40 < 41; dropping {{'loss': 0.7}}.",
    ]
    failure_at = int(size * 0.7)
    written = 0
    step = 0
    with path.open("w", encoding="utf-8") as out:
        failed = False
        while written < size:
            lines = []
            for _ in range(200):
                step += 1
                pct = step % 10000 // 100
                lines.append(
                    f"epoch {step // 10000}: {pct:3d}%|{'█' * (pct // 10):<10}| {step % 10000}/10000 "
                    f"[{step // 60:02d}:{step % 60:02d}<12:{rng.randint(10, 59)}, {rng.uniform(1, 3):.2f}it/s, "
                    f"loss={rng.uniform(0.1, 4):.4f}, lr={rng.uniform(1e-5, 1e-3):.2e}]\r"
                    f"epoch {step // 10000}: {pct:3d}%|{'█' * (pct // 10):<10}| {step % 10000 + 1}/10000"
                )
                lines.append(
                    f"2026-11-29 02:{step % 60:02d}:{rng.randint(0, 59):02d},{rng.randint(0, 999):03d} INFO "
                    f"[trainer.py:412] step={step} loss={rng.uniform(0.1, 4):.5f} grad_norm={rng.uniform(0.1, 9):.3f} "
                    f"tokens/s={rng.randint(90000, 140000)} mem_alloc={rng.uniform(60, 78):.1f}GB"
                )
                if rng.random() < 0.02:
                    lines.append(rng.choice(warnings).format(r=rng.randint(0, 7)))
            block = "\n".join(lines) + "\n"
            out.write(block)
            written += len(block.encode())
            if not failed and written >= failure_at:
                out.write(FAILURE)
                failed = True
        out.write(CASCADE * 3)


def to_ere(pattern: str, icase: bool) -> str:
    """Python/Hyperscan syntax -> POSIX ERE for GNU grep: groups without ?P<>/?:, case folded by hand."""
    pattern = re.sub(r"\(\?P<[a-z_]+>", "(", pattern).replace("(?:", "(")
    if not icase:
        return pattern
    out, i, in_class = [], 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        if char.isalpha():
            both = char.lower() + char.upper()
            out.append(both if in_class else f"[{both}]")
        else:
            out.append(char)
        i += 1
    return "".join(out)


# Linux keeps a process's RSS high-water mark across exec, so a child forked from this (large) process
# would report our peak as its own. A tiny launcher forks the measured command and reports its peak.
_LAUNCHER = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "sys.stderr.write(f'maxrss_kb={usage.ru_maxrss}\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def timed(command: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KB) of the command itself, and its stdout."""
    start = time.perf_counter()
    done = subprocess.run(["python3", "-c", _LAUNCHER, *command], capture_output=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):  # grep -c exits 1 when it counts zero
        raise SystemExit(f"{command[0]} failed ({done.returncode}): {done.stderr.decode()}")
    maxrss = int(re.search(rb"maxrss_kb=([0-9]+)", done.stderr).group(1))
    return elapsed, maxrss, done.stdout.decode()


def best_of(runs: int, command: list[str], env: dict | None = None) -> tuple[float, int, str]:
    results = [timed(command, env) for _ in range(runs)]
    return min(results, key=lambda r: r[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-big", action="store_true", help="skip the 1 GB memory check")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="trainguard-bench-"))
    try:
        log = workdir / "train.log"
        generate_log(log, args.size_mb * 1024 * 1024)
        size = log.stat().st_size

        signatures = default_table().signatures
        patterns = workdir / "patterns.ere"
        patterns.write_text("\n".join(to_ere(s.pattern, s.icase) for s in signatures) + "\n")
        trainguard = [sys.executable, "-m", "trainguard", "diagnose", str(log), "--json"]
        grep = ["grep", "-cE", "-f", str(patterns), str(log)]
        grep_env = {**os.environ, "LC_ALL": "C"}

        # Warm the page cache for both, then measure each best-of-N in the same run. Both timings
        # include starting the process (the launcher's own start-up is the same for both).
        timed(["cat", str(log)])
        timed(trainguard)
        tg_time, tg_rss, tg_out = best_of(args.runs, trainguard)
        grep_time, _, grep_out = best_of(args.runs, grep, grep_env)
        cause = json.loads(tg_out)["cause"]
        mb = size / 1e6
        print(f"log: {mb:.0f} MB, {len(signatures)} signature patterns; grep counted {grep_out.strip()} matching lines")
        print(f"trainguard diagnose: {tg_time:.3f} s  ({mb / tg_time:,.0f} MB/s)  cause={cause}")
        print(f"LC_ALL=C grep -cE:   {grep_time:.3f} s  ({mb / grep_time:,.0f} MB/s)")
        print(f"throughput ratio trainguard/grep = {grep_time / tg_time:.2f}  (goal >= 1.0)")
        if cause != "cuda_oom":
            print(f"WRONG DIAGNOSIS: {cause}")
            return 1

        print(f"peak RSS, {mb:.0f} MB log: {tg_rss / 1024:.1f} MB")
        if not args.no_big:
            big = workdir / "big.log"
            with big.open("wb") as out:
                for _ in range(-(-(1024 * 1024 * 1024) // size)):
                    with log.open("rb") as part:
                        shutil.copyfileobj(part, out, 16 * 1024 * 1024)
            big_time, big_rss, _ = timed([*trainguard[:4], str(big), "--json"])
            print(
                f"peak RSS, {big.stat().st_size / 1e6:.0f} MB log: {big_rss / 1024:.1f} MB  "
                f"(goal: well under 200 MB and independent of size; scan {big.stat().st_size / 1e6 / big_time:,.0f} MB/s)"
            )
    finally:
        if args.keep:
            print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
