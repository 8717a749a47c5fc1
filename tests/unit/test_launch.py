"""Launchers as data: which commands are launchers and what the supervisor adds to their environment;
torchrun's failure summary; each rank judged on its own lines and the job's cause taken from the rank
that failed first. On logs recorded from real torchrun 2.13 runs on CPU (tests/data/torchrun)."""

from __future__ import annotations

from pathlib import Path

from trainguard.diagnosis.evidence import ExitStatus
from trainguard.diagnosis.launch import LaunchFacts, hung_ranks, line_rank, parse_torchrun_summary
from trainguard.postmortem import LogSource, investigate
from trainguard.supervisor.launchers import environment, log_dirs, recognise

DATA = Path(__file__).resolve().parents[1] / "data" / "torchrun"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_launcher_commands_are_recognised_with_their_options() -> None:
    torchrun = recognise(["torchrun", "--nproc-per-node", "2", "--nnodes=2", "-r", "3", "train.py", "--lr", "1"])
    assert torchrun.kind == "torchrun" and torchrun.options == {"nproc-per-node": "2", "nnodes": "2", "redirects": "3"}
    assert torchrun.multi_node()
    module = recognise(
        ["python3", "-u", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "t.py"]
    )
    assert module.kind == "torchrun" and module.options == {"standalone": "", "nproc-per-node": "2"}
    assert not module.multi_node()
    assert recognise(["python", "-m", "torch.distributed.launch", "t.py"]).kind == "torchrun"
    assert recognise(["deepspeed", "--num_gpus", "2", "train.py", "--deepspeed"]).kind == "deepspeed"
    assert recognise(["deepspeed", "--hostfile", "hosts", "train.py"]).multi_node()
    accelerate = recognise(["accelerate", "launch", "--num_processes", "2", "--num_machines", "2", "train.py"])
    assert accelerate.kind == "accelerate" and accelerate.multi_node()
    for plain in (["python", "train.py"], ["python", "-m", "mypkg.train"], ["accelerate", "config"], []):
        assert recognise(plain) is None


def test_torchrun_gets_a_log_folder_and_tee_unless_the_user_chose_them() -> None:
    kwargs = {"ranks_dir": "/state/runs/r/attempt-1.ranks", "error_file": "/state/runs/r/attempt-1.launcher-error.json"}
    plain = recognise(["torchrun", "--nproc-per-node", "2", "train.py"])
    assert environment(plain, {}, **kwargs) == {
        "PET_LOG_DIR": "/state/runs/r/attempt-1.ranks",
        "PET_TEE": "3",
        "TORCHELASTIC_ERROR_FILE": "/state/runs/r/attempt-1.launcher-error.json",
    }
    assert log_dirs(plain, {"PET_LOG_DIR": "/state/runs/r/attempt-1.ranks"}) == ["/state/runs/r/attempt-1.ranks"]
    chosen = recognise(["torchrun", "--log-dir", "/logs", "--redirects", "3", "train.py"])
    assert environment(chosen, {"TORCHELASTIC_ERROR_FILE": "/mine.json"}, **kwargs) == {}
    assert log_dirs(chosen, {}) == ["/logs"]
    assert environment(plain, {"PET_LOG_DIR": "/env-logs", "PET_TEE": "1"}, **kwargs) == {
        "TORCHELASTIC_ERROR_FILE": "/state/runs/r/attempt-1.launcher-error.json"
    }
    # accelerate launch overrides torchrun's PET_ defaults with its own --log_dir/--tee: nothing to set
    assert environment(recognise(["accelerate", "launch", "t.py"]), {}, **kwargs) == {}
    assert log_dirs(recognise(["deepspeed", "--enable_each_rank_log", "/ds", "t.py"]), {}) == ["/ds"]


def test_the_failure_summary_names_the_first_failure_and_the_ranks_torn_down_after_it() -> None:
    failures = parse_torchrun_summary(text("raise-launcher.log"))
    assert [(f.rank, f.local_rank, f.exitcode, f.first) for f in failures] == [(0, 0, -15, False), (1, 1, -6, True)]
    assert failures[1].time == "2026-12-01_04:41:52" and failures[1].host == "localhost"
    assert failures[1].error_file is None and failures[1].signal == 6
    peer = parse_torchrun_summary(text("peer-node-launcher.log"))  # "<NO_OTHER_FAILURES>"
    assert [(f.rank, f.local_rank, f.exitcode, f.first) for f in peer] == [(1, 0, 1, True)]
    assert parse_torchrun_summary("Traceback (most recent call last):\nValueError: x\n") == ()


def test_lines_are_attributed_to_global_ranks() -> None:
    facts = LaunchFacts(global_ranks={0: 1})  # this node's local rank 0 is the job's rank 1
    assert line_rank("[default0]:[rank1]: RuntimeError: Connection closed by peer", facts) == 1
    assert line_rank("[default0]:rank 1 step 3", facts) == 1
    assert line_rank("E1201 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 1) of binary", facts) == 1
    assert line_rank("[default1]:step 3") == 1  # one node: local ranks are the ranks


def judge(launcher: str, *ranks: tuple[str, int], exit_code: int = 1):
    launcher_text = text(launcher)
    logs = [LogSource(None, [launcher_text.encode()])] + [LogSource(n, [text(n).encode()], rank=r) for n, r in ranks]
    facts = LaunchFacts(failures=parse_torchrun_summary(launcher_text))
    return investigate(logs, exit_status=ExitStatus(code=exit_code), launch=facts)


def test_a_rank_raising_is_the_cause_not_rank_0s_lost_peer_nor_the_agents_sigterm() -> None:
    # In the console rank 0's "Connection closed by peer" comes BEFORE rank 1's traceback, and the
    # summary lists rank 0's SIGTERM: read line by line this log said "preempted".
    report = judge("raise-launcher.log", ("raise-rank0-stderr.log", 0), ("raise-rank1-stderr.log", 1))
    assert report.diagnosis.cause == "python_error"
    assert report.first_failure["rank"] == 1 and report.first_failure["local_rank"] == 1
    assert report.first_failure["file"] == "raise-rank1-stderr.log"
    assert any("ValueError: bad batch in rank 1" in e.text for e in report.diagnosis.evidence)
    assert not any(e.rank == 0 for e in report.diagnosis.evidence)


def test_a_rank_killed_by_sigkill_is_named_with_its_rank_from_the_launchers_console_alone() -> None:
    report = judge("sigkill-launcher.log")
    assert report.diagnosis.cause == "host_oom"  # no kernel log read here: SIGKILL is most often the OOM killer
    assert report.first_failure == {"rank": 1, "local_rank": 1, "host": "localhost", "time": "2026-12-01_04:41:57"}
    assert "peer_failure" not in [c for c, _ in report.diagnosis.alternatives][:1]


def test_a_node_whose_peer_died_says_peer_failure_and_names_no_rank_of_its_own() -> None:
    report = judge("peer-node-launcher.log")
    assert report.diagnosis.cause == "peer_failure"
    assert report.first_failure is None  # the first failure is on another node


def test_the_hung_rank_is_the_one_not_waiting_in_a_collective() -> None:
    waiting = 'Thread 1 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:3252)\n'
    sleeping = 'Thread 2 (idle): "MainThread"\n    <module> (train.py:43)\n'
    assert hung_ranks({0: waiting, 1: sleeping, 2: waiting}) == (1,)
    assert hung_ranks({0: waiting, 1: waiting}) == ()  # all wait: a deadlock with no straggler to name
    assert hung_ranks({0: sleeping, 1: sleeping}) == ()  # none waits: not a collective hang
