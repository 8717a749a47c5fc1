"""`status` says the checkpoint interval `every="auto"` chose for the running job, why, and what a
death costs on average at it (issue 20): read from what the job's Checkpointer reported, with the
MTBF the supervisor handed it from this machine's history."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.real.runs import run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real

AUTO = """
    import time
    from trainguard import Checkpointer
    with Checkpointer(every="auto") as ckpt:
        step = 0
        while True:
            time.sleep(0.05)
            ckpt.maybe_save(step, lambda: {"step": step})
            if ckpt.stop_requested:
                break
            step += 1
"""


def test_status_shows_the_interval_every_auto_chose_and_the_loss_it_means(tmp_path: Path, home: Path) -> None:
    run_id = run_id_from(tg("run", "--", sys.executable, script(tmp_path, "auto.py", AUTO)).stdout)
    try:
        chosen = wait_for(lambda: status(run_id)["checkpoint_interval"], timeout=30, what="the interval reported")
        assert chosen["expected_loss_per_death_s"] == chosen["seconds"] / 2
        assert chosen["why"] and chosen["why_zh"]
        shown = tg("status", run_id)
        assert "checkpoints: every " in shown.stdout and "a death costs" in shown.stdout, shown.stdout
        assert chosen["why"] in shown.stdout
        zh = tg("status", run_id, env={**os.environ, "LANG": "zh_CN.UTF-8"})
        assert "检查点：每 " in zh.stdout and chosen["why_zh"] in zh.stdout, zh.stdout
    finally:
        tg("stop", run_id, "--grace", "5s")
