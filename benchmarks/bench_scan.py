"""Scan benchmark: `trainguard diagnose --json` against `LC_ALL=C grep -cE` and ripgrep over the same
log, in the same run, each best of N with the page cache warm.

A realistic 512 MB training log (tqdm bars with carriage returns, per-step metrics, NCCL INFO lines and
harmless NCCL WARN lines by the thousand, deprecation warnings, Python warnings that say Error) with
one CUDA OOM traceback at 97% of the file and the torchrun cascade after it. grep and ripgrep get the
signature patterns (translated to POSIX ERE). Prints throughput, the ratios grep_time /
trainguard_time (goal >= 2.0 on two cores) and rg_time / trainguard_time, where one core's time goes
(read, Hyperscan, newline count, start-up), and trainguard's peak memory on the 512 MB and a 1 GB log
(goal: well under 200 MB, flat).

    python benchmarks/bench_scan.py [--size-mb 512] [--runs 5] [--log FILE] [--no-big] [--no-profile] [--keep]
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainguard.diagnosis.signatures import default_table  # noqa: E402

# Harmless lines that look alarming, each as real training jobs print them. Several of them hit a
# signature's pattern (NCCL's "NET/IB : Got async event", a caught error printed at the start of a
# line), so the scanner's confirm path is exercised thousands of times, not only its fast path.
NCCL_INFO = [
    "{host}:{pid}:{tid} [{r}] NCCL INFO Channel {c:02d}/24 : {r}[{r}] -> {n}[{n}] via P2P/CUMEM/read",
    "{host}:{pid}:{tid} [{r}] NCCL INFO NET/Socket : Using [0]eth0:10.0.3.{r}<0>",
    "{host}:{pid}:{tid} [{r}] NCCL INFO comm 0x55d3c8a1e2f0 rank {r} nranks 8 cudaDev {r} busId {r}a000 commId 0x3f1c2b9d - Init COMPLETE",
    "{host}:{pid}:{tid} [{r}] NCCL INFO Using network Socket",
    "{host}:{pid}:{tid} [{r}] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
]
NCCL_WARN = [
    "{host}:{pid}:{tid} [{r}] NCCL WARN NET/IB : Got async event : GID table change",
    "{host}:{pid}:{tid} [{r}] NCCL WARN Failed to open libibverbs.so[.1]",
    "{host}:{pid}:{tid} [{r}] NCCL WARN Could not find real path of /sys/class/pci_bus/0000:{r}a/../../0000:{r}a:00.0",
]
WARNINGS = [
    "/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:295: UserWarning: torch.utils.checkpoint: "
    "the use_reentrant parameter should be passed explicitly.",
    "/opt/conda/lib/python3.11/site-packages/torch/cuda/amp/grad_scaler.py:126: FutureWarning: warning: "
    "`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use `torch.amp.GradScaler('cuda', args...)` instead.",
    "warning: `resume_download` is deprecated and will be removed in version 1.0.0. Downloads always resume when possible.",
    "[rank{r}]:[W1129 02:13:55.412000 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank {r}]  using GPU {r} to perform "
    "barrier as devices used by this process are currently unknown. This can potentially cause a hang if this rank to "
    "GPU mapping is incorrect.",
    "[rank{r}]: W1129 02:13:55.41 torch/_dynamo/convert_frame.py:844] torch._dynamo hit config.cache_size_limit (8)",
    "wandb: WARNING Step must only increase in log calls. Step 40 < 41; dropping {{'loss': 0.7}}.",
    "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot "
    "assign requested address).",
]
# Python warnings with the word Error in them; the last is a caught, retried error that a library
# printed at the start of a line: the exception pattern flags it.
ERROR_WORDS = [
    "/opt/conda/lib/python3.11/site-packages/torch/autograd/graph.py:825: UserWarning: Error detected in "
    "CudnnConvolutionBackward0. Traceback of forward call that caused the error:",
    "/opt/conda/lib/python3.11/site-packages/datasets/load.py:1491: FutureWarning: The repository for c4 contains "
    "custom code; an ImportError will be raised in a future version.",
    "ConnectionResetError: [Errno 104] Connection reset by peer (wandb retrying upload, attempt {a})",
]
FAILURE = """[rank3]: Traceback (most recent call last):
[rank3]:   File "/workspace/train.py", line 311, in <module>
[rank3]:     loss.backward()
[rank3]:   File "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
[rank3]:     torch.autograd.backward(
[rank3]:   File "/opt/conda/lib/python3.11/site-packages/torch/autograd/graph.py", line 825, in _engine_run_backward
[rank3]:     return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a total capacity of 79.19 GiB of which 1.02 GiB is free.
"""
CASCADE = """[rank0]:[E1129 02:47:21.715298746 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=91842, OpType=ALLREDUCE, NumelIn=86567656, NumelOut=86567656, Timeout(ms)=600000) ran for 600085 milliseconds before timing out.
W1129 02:47:23.102000 140213 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 140281 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def _tqdm(step: int, rng: random.Random) -> str:
    """A tqdm bar written to a file: a dozen screen states joined by carriage returns, then a newline."""
    states = []
    for tick in range(step, step + 12):
        done = tick % 10000
        pct = done // 100
        bar = "█" * (pct // 10) + " " * (10 - pct // 10)
        states.append(
            f"Epoch {tick // 10000}: {pct:3d}%|{bar}| {done}/10000 [{tick // 3600:02d}:{tick // 60 % 60:02d}<"
            f"{rng.randint(10, 59)}:{rng.randint(10, 59)}, {rng.uniform(1, 3):.2f}it/s, loss={rng.uniform(0.1, 4):.4f}, "
            f"lr={rng.uniform(1e-5, 1e-3):.2e}]"
        )
    return "\r".join(states)


def generate_log(path: Path, size: int, seed: int = 7) -> None:
    """A realistic training log of ``size`` bytes: tqdm bars, per-step metrics, NCCL chatter (INFO and
    harmless WARN lines by the thousand), deprecation warnings, Python warnings that say Error, then one
    CUDA OOM traceback at 97% of the file and the torchrun cascade after it."""
    rng = random.Random(seed)
    host, pid = "gpu-node-07", 140281
    failure_at = int(size * 0.97)
    written = 0
    step = 0
    with path.open("w", encoding="utf-8", newline="") as out:
        failed = False
        while written < size:
            lines = []
            for _ in range(100):
                step += 1
                r = rng.randint(0, 7)
                lines.append(_tqdm(step, rng))
                lines.append(
                    f"2026-11-29 02:{step // 60 % 60:02d}:{step % 60:02d},{rng.randint(0, 999):03d} INFO [trainer.py:412] "
                    f"step={step} loss={rng.uniform(0.1, 4):.5f} grad_norm={rng.uniform(0.1, 9):.3f} "
                    f"tokens/s={rng.randint(90000, 140000)} mem_alloc={rng.uniform(60, 78):.1f}GB"
                )
                lines.append(
                    f"{{'loss': {rng.uniform(0.1, 4):.4f}, 'grad_norm': {rng.uniform(0.1, 9):.4f}, "
                    f"'learning_rate': {rng.uniform(1e-5, 1e-3):.3e}, 'epoch': {step / 10000:.2f}}}"
                )
                fields = {"host": host, "pid": pid + r, "tid": 140400 + r, "r": r, "n": (r + 1) % 8, "c": step % 24}
                for _ in range(rng.randint(0, 4)):
                    lines.append(rng.choice(NCCL_INFO).format(**fields))
                if rng.random() < 0.3:
                    lines.append(rng.choice(NCCL_WARN).format(**fields))
                if rng.random() < 0.04:
                    lines.append(rng.choice(WARNINGS).format(r=r))
                if rng.random() < 0.0005:
                    lines.append(rng.choice(ERROR_WORDS).format(a=rng.randint(1, 5)))
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
        if char.isascii() and char.isalpha():  # case means nothing to 段错误 or 已杀死
            both = char.lower() + char.upper()
            out.append(both if in_class else f"[{both}]")
        else:
            out.append(char)
        i += 1
    return "".join(out)


def to_byte_regex(ere: str) -> str:
    """The same for ripgrep --no-unicode, which matches bytes: a non-ASCII character becomes its
    UTF-8 bytes (\\xHH each), as grep under LC_ALL=C reads it."""
    return "".join(char if char.isascii() else "".join(f"\\x{b:02X}" for b in char.encode()) for char in ere)


# Linux keeps a process's RSS high-water mark across exec, so a child forked from this (large) process
# would report our peak as its own. A tiny launcher forks the measured command and reports its wall
# time (from its start to its exit, without the launcher's own start-up), its CPU time and its peak
# RSS (each counts the worker processes it waited for; the peak is the largest of them).
_LAUNCHER = (
    "import os, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "cpu = usage.ru_utime + usage.ru_stime\n"
    "sys.stderr.write(f'elapsed={time.perf_counter() - start} cpu={cpu} maxrss_kb={usage.ru_maxrss}\\n')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


@dataclass
class Timing:
    wall: float  # seconds
    cpu: float  # user + system seconds, the command and its workers
    maxrss_kb: int
    stdout: str


def timed(command: list[str], env: dict | None = None) -> Timing:
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *command], capture_output=True, env=env, check=False)
    if done.returncode not in (0, 1):  # grep -c exits 1 when it counts zero
        raise SystemExit(f"{command[0]} failed ({done.returncode}): {done.stderr.decode()}")
    found = re.search(rb"elapsed=([0-9.e-]+) cpu=([0-9.e-]+) maxrss_kb=([0-9]+)", done.stderr)
    return Timing(float(found.group(1)), float(found.group(2)), int(found.group(3)), done.stdout.decode())


def best_of(runs: int, commands: dict[str, tuple[list[str], dict | None]]) -> dict[str, Timing]:
    """Each command's fastest of ``runs``, the commands taking turns: on a machine shared with other
    work, a busy moment then slows one round of all of them rather than all runs of one."""
    results: dict[str, list[Timing]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (command, env) in commands.items():
            results[name].append(timed(command, env))
    return {name: min(timings, key=lambda t: t.wall) for name, timings in results.items()}


def stage_profile(log: Path, patterns: list, tiny: Path, trainguard: list[str], env: dict, runs: int) -> None:
    """Where one core's time goes on this log, stage by stage (each best of ``runs``): reading the
    file in 1 MiB blocks, Hyperscan over them, counting newlines, and starting the command."""
    import hyperscan

    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(
        expressions=[p.pattern.encode() for p in patterns],
        ids=list(range(len(patterns))),
        elements=len(patterns),
        flags=[hyperscan.HS_FLAG_MULTILINE | (hyperscan.HS_FLAG_CASELESS if p.icase else 0) for p in patterns],
    )
    scratch = hyperscan.Scratch(database)
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)

    def read_only(_block: int) -> None:
        pass

    def scan(length: int) -> None:
        database.scan(view[:length], match_event_handler=lambda *_: None, scratch=scratch)

    def count(length: int) -> None:
        buffer.count(b"\n", 0, length)

    def one_pass(work) -> float:
        fd = os.open(log, os.O_RDONLY)
        try:
            start, position = time.perf_counter(), 0
            while got := os.preadv(fd, [view], position):
                position += got
                work(got)
            return time.perf_counter() - start
        finally:
            os.close(fd)

    read = min(one_pass(read_only) for _ in range(runs))
    hyperscan_time = min(one_pass(scan) for _ in range(runs)) - read
    newline_time = min(one_pass(count) for _ in range(runs)) - read
    startup = best_of(runs, {"startup": ([*trainguard[:4], str(tiny), "--json"], env)})["startup"].wall
    print(
        f"profile, one core: read {read:.3f} s, Hyperscan {hyperscan_time:.3f} s, newline count {newline_time:.3f} s; "
        f"start-up (diagnose of a 1-line log) {startup:.3f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--log", type=Path, help="use this log instead of generating one")
    parser.add_argument("--no-big", action="store_true", help="skip the 1 GB memory check")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-stage profile")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="trainguard-bench-"))
    try:
        log = args.log or workdir / "train.log"
        if args.log is None:
            generate_log(log, args.size_mb * 1024 * 1024)
        size = log.stat().st_size

        signatures = default_table().signatures
        patterns = workdir / "patterns.ere"
        patterns.write_text("\n".join(to_ere(s.pattern, s.icase) for s in signatures) + "\n")
        trainguard = [sys.executable, "-m", "trainguard", "diagnose", str(log), "--json"]
        # Bytecode cached as an installed package has it (pip compiles it; an editable checkout with
        # PYTHONDONTWRITEBYTECODE would compile every module on every start), kept in the workdir.
        tg_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        tg_env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
        grep = ["grep", "-cE", "-f", str(patterns), str(log)]
        grep_env = {**os.environ, "LC_ALL": "C"}
        # ripgrep's default Unicode mode runs its word boundaries (\b) on a slow engine once a line
        # holds a non-ASCII byte (every tqdm bar): minutes on this log. --no-unicode is the same
        # byte-wise matching as grep under LC_ALL=C.
        rg_patterns = workdir / "patterns.rg"
        rg_patterns.write_text("\n".join(to_byte_regex(to_ere(s.pattern, s.icase)) for s in signatures) + "\n")
        rg = ["rg", "-c", "--no-unicode", "-f", str(rg_patterns), str(log)] if shutil.which("rg") else None

        # Warm the page cache and the bytecode cache, then measure each best-of-N in the same run.
        timed(["cat", str(log)])
        timed(trainguard, tg_env)
        commands = {"trainguard": (trainguard, tg_env), "grep": (grep, grep_env)}
        if rg:
            commands["rg"] = (rg, None)
        best = best_of(args.runs, commands)
        tg = best["trainguard"]
        cause = json.loads(tg.stdout)["cause"]
        mb = size / 1e6
        print(
            f"log: {mb:.0f} MB, {len(signatures)} signature patterns; grep counted {best['grep'].stdout.strip()} lines"
        )
        labels = {"trainguard": "trainguard diagnose", "grep": "LC_ALL=C grep -cE", "rg": "rg -c --no-unicode"}
        for name, timing in best.items():
            print(
                f"{labels[name] + ':':21}{timing.wall:.3f} s  ({mb / timing.wall:,.0f} MB/s)  cpu {timing.cpu:.3f} s"
                + (f"  cause={cause}  cpus={_cpus()}" if name == "trainguard" else f"  counted {timing.stdout.strip()}")
            )
        print(f"throughput ratio trainguard/grep = {best['grep'].wall / tg.wall:.2f}  (goal >= 2.0)")
        if rg:
            print(f"throughput ratio trainguard/ripgrep = {best['rg'].wall / tg.wall:.2f}")
        if cause != "cuda_oom":
            print(f"WRONG DIAGNOSIS: {cause}")
            return 1

        if not args.no_profile:
            tiny = workdir / "tiny.log"
            tiny.write_text("step 1 loss 0.5\n")
            stage_profile(log, signatures, tiny, trainguard, tg_env, args.runs)

        print(f"peak RSS, {mb:.0f} MB log: {tg.maxrss_kb / 1024:.1f} MB")
        if not args.no_big:
            big = workdir / "big.log"
            with big.open("wb") as out:
                for _ in range(-(-(1024 * 1024 * 1024) // size)):
                    with log.open("rb") as part:
                        shutil.copyfileobj(part, out, 16 * 1024 * 1024)
            timed(["cat", str(big)])
            big_run = timed([*trainguard[:4], str(big), "--json"], tg_env)
            print(
                f"peak RSS, {big.stat().st_size / 1e6:.0f} MB log: {big_run.maxrss_kb / 1024:.1f} MB  "
                f"(goal: well under 200 MB and independent of size; scan {big.stat().st_size / 1e6 / big_run.wall:,.0f} MB/s)"
            )
    finally:
        if args.keep:
            print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
