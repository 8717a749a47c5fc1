"""`trainguard top` benchmark: what the live view costs while it is left open, against a baseline
measured in the same run.

top runs in a pseudo-terminal (120x40, what a person's terminal gives it) over a state folder with
one run training, two ended ones and --history older ended runs, refreshing every --interval
seconds, for --seconds. Its CPU time (user + system, its whole process tree) is read from /proc.
The baseline is what people leave open instead: `watch -n INTERVAL trainguard ps`, run for the same
time (one `trainguard ps` process per refresh).

    python benchmarks/bench_top.py [--seconds 30] [--interval 2] [--history 50]

Prints the share of one core each takes and their ratio (goal: top <= 5% of a core at 2 s, and less
than the baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import psutil

TOY = [sys.executable, "-m", "trainguard.demo.toyjob"]


def tg(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], env={**os.environ, "TRAINGUARD_HOME": str(home)},
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def tree_cpu_seconds(process: psutil.Process) -> float:
    total = 0.0
    for proc in [process, *process.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            continue
    return total


def measure_top(home: Path, seconds: float, interval: float) -> tuple[float, int]:
    """CPU seconds top used over ``seconds`` after its start-up, and the bytes it drew."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TRAINGUARD_HOME"] = str(home)
        os.execv(sys.executable, [sys.executable, "-m", "trainguard", "top", "--interval", str(interval)])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    drawn = 0

    def drain(until: float) -> None:
        nonlocal drawn
        while time.monotonic() < until:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    drawn += len(os.read(fd, 1 << 16))
                except OSError:
                    return

    drain(time.monotonic() + 5)  # start-up (imports, NVML) is not what staying open costs
    process = psutil.Process(pid)
    before = tree_cpu_seconds(process)
    drawn = 0
    drain(time.monotonic() + seconds)
    used = tree_cpu_seconds(process) - before
    os.write(fd, b"q")
    drain(time.monotonic() + 3)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    os.close(fd)
    return used, drawn


def measure_watch_ps(home: Path, seconds: float, interval: float) -> float:
    """CPU seconds of `watch -n interval trainguard ps` over ``seconds``: one ps process per refresh."""
    start_usage = os.times()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.monotonic()
        tg(home, "ps")
        time.sleep(max(0.0, interval - (time.monotonic() - began)))
    end_usage = os.times()
    return (end_usage.children_user - start_usage.children_user) + (
        end_usage.children_system - start_usage.children_system
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--history", type=int, default=50, help="older ended runs in the state folder")
    args = parser.parse_args()
    if args.seconds <= 0 or args.interval <= 0 or args.history < 0:
        print("bench_top: --seconds and --interval must be positive, --history at least 0", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-top-") as tmp:
        home = Path(tmp) / "state"
        for n in range(args.history):
            tg(home, "run", "--foreground", "--name", f"old-{n}", "--", sys.executable, "-c", "pass")
        tg(home, "run", "--foreground", "--name", "broken", "--", *TOY, "--fault", "python_error", "--fault-step", "2")
        tg(home, "run", "--name", "live", "--", *TOY, "--steps", "1000000", "--step-seconds", "0.05")
        try:
            top_cpu, drawn = measure_top(home, args.seconds, args.interval)
            ps_cpu = measure_watch_ps(home, args.seconds, args.interval)
        finally:
            tg(home, "stop", "live", "--grace", "1s")
    runs = args.history + 2
    top_share, ps_share = top_cpu / args.seconds, ps_cpu / args.seconds
    print(
        f"trainguard top over {runs} runs, refreshing every {args.interval:g} s for {args.seconds:g} s in a 120x40 pty:"
    )
    print(
        f"  top:                      {100 * top_share:5.2f}% of one core ({drawn / args.seconds / 1024:.1f} KiB/s drawn)"
    )
    print(f"  watch -n {args.interval:g} trainguard ps: {100 * ps_share:5.2f}% of one core (baseline)")
    print(f"  ratio top / baseline:     {top_share / ps_share:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
