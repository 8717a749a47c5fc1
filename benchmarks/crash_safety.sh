#!/usr/bin/env bash
# Crash safety at scale: the suite's random-SIGKILL test, run with hundreds of kills.
#   bash benchmarks/crash_safety.sh [KILLS]     (default 300; about 2 s a kill on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
TRAINGUARD_CRASH_KILLS="${1:-300}" python -m pytest -q -s tests/checkpoint/test_crash_safety.py
