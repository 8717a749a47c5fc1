"""Real torchrun, two CPU ranks standing for two nodes whose trainguard counted their attempts apart
(node 0 ended peer_failure and was restarted: attempt 2; node 1 started fresh: attempt 1) and whose
torchrun agents counted their restarts apart: a SIGTERM that reaches one rank still stops both at one
step, and that step holds both shards (issue 19.7). Before, each rank planned alone: both warned
"only 1 of the job's 2 ranks made a Checkpointer" and the stop save held one rank's shard."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.conftest import env_with_hook
from tests.chaos.test_rank_agreement import shards, torchrun

pytestmark = [pytest.mark.real, pytest.mark.slow]

AS_TWO_NODES = """
import os
if "RANK" in os.environ:  # the ranks, not the launcher: each as on its own node
    os.environ["TRAINGUARD_ATTEMPT"] = str(2 - int(os.environ["RANK"]))
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(1 - int(os.environ["RANK"]))
"""


def test_a_sigterm_to_one_rank_stops_both_nodes_ranks_at_one_complete_step(tmp_path: Path) -> None:
    env = env_with_hook(tmp_path, AS_TWO_NODES, SIGTERM_AT="40")
    hook = {key: env[key] for key in ("PYTHONPATH", "SIGTERM_AT")}
    done, folder = torchrun(tmp_path, 400, **hook)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "only 1 of the job's 2 ranks made a Checkpointer" not in done.stderr
    left = sorted(line for line in done.stdout.splitlines() if " left at step " in line)
    assert len(left) == 2 and all("stop_requested=True" in line for line in left), left
    (step,) = {line.split(" left at step ")[1].split()[0] for line in left}
    assert shards(folder)[f"step-{int(step):012d}"] == ["job.json", "rank-00000", "rank-00001"]
