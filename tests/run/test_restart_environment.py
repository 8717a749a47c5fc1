"""A continued run keeps the environment and working folder of its `run`, whoever continues it and from
whatever shell: `trainguard restart` from another shell, `restart --env`/`--unset-env` changing one
variable for good, the record private (0600, never in `status --json`), a run recorded by an older
trainguard continued with the caller's environment and told so. Real commands, real jobs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import sys
from pathlib import Path

import pytest

from tests.real.runs import run_id_from, script, status, tg, wait_for
from trainguard.errors import UsageError
from trainguard.supervisor.run_environment import FILE_NAME, continued, parse_env_changes

pytestmark = pytest.mark.real

# What the job was given, one JSON line per attempt, then a clean exit.
SHOW = """
    import json, os
    print(json.dumps({"steps": os.environ.get("STEPS", "400"), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "cwd": os.getcwd(), "attempt": os.environ["TRAINGUARD_ATTEMPT"],
                      "slurm": sorted(k for k in os.environ if k.startswith("SLURM_"))}), flush=True)
"""
SECRET = "hf_0123456789abcdefSECRET"


def _shell(**extra: str) -> dict[str, str]:
    """An environment as another shell would have it: none of the variables the run was given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("STEPS", "CUDA_VISIBLE_DEVICES", "HF_TOKEN") and not k.startswith("SLURM_")}  # fmt: skip
    return {**env, **extra}


def _seen(run_id: str, attempt: int) -> dict:
    info = status(run_id)
    log = Path(next(a["log_path"] for a in info["attempts"] if a["n"] == attempt))
    lines = [line for line in log.read_text().splitlines() if line.startswith("{")]
    assert lines, log.read_text()
    return json.loads(lines[-1])


def _ended(run_id: str, attempts: int) -> None:
    wait_for(lambda: len((info := status(run_id))["attempts"]) == attempts and info["state"] == "succeeded",
             timeout=30, what=f"attempt {attempts} to end")  # fmt: skip


def _start(tmp_path: Path, workdir: Path, **env: str) -> tuple[str, str]:
    job = script(tmp_path, "show.py", SHOW)
    started = tg("run", "--name", "long", "--restart", "never", "--", sys.executable, job, cwd=workdir,
                 env=_shell(**env))  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    _ended(run_id, 1)
    return run_id, job


def test_restart_from_another_shell_and_folder_keeps_the_runs_environment_and_folder(tmp_path: Path) -> None:
    workdir, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    workdir.mkdir()
    elsewhere.mkdir()
    run_id, _ = _start(tmp_path, workdir, STEPS="3000", CUDA_VISIBLE_DEVICES="1")
    assert _seen(run_id, 1) == {"steps": "3000", "gpus": "1", "cwd": str(workdir), "attempt": "1", "slurm": []}

    again = tg("restart", "long", cwd=elsewhere, env=_shell())
    assert again.returncode == 0, again.stderr
    assert "note" not in again.stderr, again.stderr
    _ended(run_id, 2)
    assert _seen(run_id, 2) == {"steps": "3000", "gpus": "1", "cwd": str(workdir), "attempt": "2", "slurm": []}


def test_restart_env_changes_a_variable_for_this_attempt_and_the_later_ones(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    run_id, _ = _start(tmp_path, workdir, STEPS="3000", CUDA_VISIBLE_DEVICES="1")

    changed = tg("restart", "long", "--env", "STEPS=5", "--unset-env", "CUDA_VISIBLE_DEVICES", env=_shell())
    assert changed.returncode == 0, changed.stderr
    _ended(run_id, 2)
    assert (_seen(run_id, 2)["steps"], _seen(run_id, 2)["gpus"]) == ("5", None)

    plain = tg("restart", "long", "--env", "CUDA_VISIBLE_DEVICES=", env=_shell(STEPS="99"))
    assert plain.returncode == 0, plain.stderr
    _ended(run_id, 3)
    assert (_seen(run_id, 3)["steps"], _seen(run_id, 3)["gpus"]) == ("5", "")  # KEY= sets it empty


def test_the_environment_record_is_private_and_never_shown(tmp_path: Path, home: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    run_id, _ = _start(tmp_path, workdir, HF_TOKEN=SECRET)
    record = home / "runs" / run_id / FILE_NAME
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert stat.S_IMODE(record.parent.stat().st_mode) == 0o700
    assert json.loads(record.read_text())["HF_TOKEN"] == SECRET
    again = tg("restart", "long", "--env", f"HF_TOKEN={SECRET}2", env=_shell())
    assert again.returncode == 0, again.stderr
    _ended(run_id, 2)
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_text())["HF_TOKEN"] == f"{SECRET}2"
    shown = [again.stdout, again.stderr]
    for command in (["status", run_id, "--json"], ["status", run_id], ["ps", "--json"], ["ps"]):
        done = tg(*command)
        assert done.returncode in (0, 1), done.stderr
        shown += [done.stdout, done.stderr]
    assert not [text for text in shown if SECRET in text]
    assert str(workdir) in tg("status", run_id).stdout  # the working folder is shown, under folder:


def test_a_working_folder_that_is_gone_is_a_one_line_refusal(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    run_id, _ = _start(tmp_path, workdir)
    workdir.rmdir()
    refused = tg("restart", "long", cwd=tmp_path, env=_shell())
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and str(workdir) in refused.stderr, refused.stderr
    info = status(run_id)
    assert info["state"] == "succeeded" and len(info["attempts"]) == 1


def test_a_run_recorded_without_its_environment_continues_with_the_callers_and_says_so(
    tmp_path: Path, home: Path
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    run_id, _ = _start(tmp_path, workdir, STEPS="3000")
    record = home / "runs" / run_id / FILE_NAME
    record.unlink()  # as an older trainguard left it

    again = tg("restart", "long", env=_shell(STEPS="7"))
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("older trainguard") == 1, again.stderr
    _ended(run_id, 2)
    assert _seen(run_id, 2)["steps"] == "7"
    assert json.loads(record.read_text())["STEPS"] == "7"  # recorded from now on: the next restart says nothing
    quiet = tg("restart", "long", env=_shell())
    assert quiet.returncode == 0 and "older trainguard" not in quiet.stderr, quiet.stderr
    _ended(run_id, 3)
    assert _seen(run_id, 3)["steps"] == "7"


def test_run_with_the_name_of_an_ended_run_records_its_own_shells_environment(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    run_id, job = _start(tmp_path, workdir, STEPS="3000")
    again = tg("run", "--name", "long", "--restart", "never", "--", sys.executable, job, cwd=tmp_path,
               env=_shell(STEPS="12"))  # fmt: skip
    assert again.returncode == 0, again.stderr
    _ended(run_id, 2)
    assert (_seen(run_id, 2)["steps"], _seen(run_id, 2)["cwd"]) == ("12", str(tmp_path))


def test_a_run_adopted_from_another_shell_restarts_its_job_with_the_runs_environment(tmp_path: Path,
                                                                                     home: Path) -> None:  # fmt: skip
    job = script(tmp_path, "show_then_wait.py", SHOW + """
    import time
    if os.environ["TRAINGUARD_ATTEMPT"] == "1":
        time.sleep(300)
""")  # fmt: skip
    started = tg("run", "--name", "long", "--", sys.executable, job, cwd=tmp_path, env=_shell(STEPS="3000"))
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    wait_for(lambda: _has_output(run_id), what="attempt 1's output")
    with sqlite3.connect(home / "runs.sqlite") as db:
        supervisor = db.execute("SELECT supervisor_pid FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: status(run_id)["supervisor"] == "gone", what="the supervisor to be gone")
    adopted = tg("adopt", "long", env=_shell())
    assert adopted.returncode == 0, adopted.stderr
    os.kill(status(run_id)["pid"], signal.SIGKILL)  # the adopting supervisor restarts it
    _ended(run_id, 2)
    assert _seen(run_id, 2)["steps"] == "3000"


def _has_output(run_id: str) -> bool:
    attempts = status(run_id)["attempts"]
    return bool(attempts) and "{" in Path(attempts[-1]["log_path"]).read_text()


def test_slurms_variables_come_from_the_allocation_the_run_is_continued_in(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    job = script(tmp_path, "show.py", SHOW)
    first = tg("run", "--foreground", "--name", "long", "--restart", "never", "--", sys.executable, job,
               cwd=workdir, env=_shell(SLURM_JOB_ID="100", SLURM_NTASKS="8", CUDA_VISIBLE_DEVICES="0,1"))  # fmt: skip
    assert first.returncode == 0, first.stderr
    run_id = status("long")["id"]
    assert _seen(run_id, 1)["slurm"] == ["SLURM_JOB_ID", "SLURM_NTASKS"]

    outside = tg("restart", "long", env=_shell())  # the allocation is over: none of its variables
    assert outside.returncode == 0, outside.stderr
    _ended(run_id, 2)
    assert (_seen(run_id, 2)["slurm"], _seen(run_id, 2)["gpus"]) == ([], "0,1")

    inside = tg("restart", "long", "--foreground", env=_shell(SLURM_JOB_ID="200", SLURM_PROCID="0",
                                                              CUDA_VISIBLE_DEVICES="2"))  # fmt: skip
    assert inside.returncode == 0, inside.stderr
    assert (_seen(run_id, 3)["slurm"], _seen(run_id, 3)["gpus"]) == (["SLURM_JOB_ID", "SLURM_PROCID"], "2")


def test_env_options_are_checked_and_never_echo_a_value() -> None:
    assert parse_env_changes(["A=1", "B=", "A=2", "C=x=y"], ["D"]) == {"A": "2", "B": "", "C": "x=y", "D": None}
    for assignments, removals in ((["=hunter2"], []), (["NOVALUE"], []), ([], ["A=hunter2"]), (["A=1"], ["A"])):
        with pytest.raises(UsageError) as refused:
            parse_env_changes(assignments, removals)
        assert "hunter2" not in refused.value.message_en + refused.value.message_zh
    done = tg("restart", "nosuch", "--env", "=hunter2")
    assert done.returncode == 2 and "hunter2" not in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_continued_takes_only_the_allocations_variables_from_the_caller() -> None:
    recorded = {"PATH": "/a", "STEPS": "3000", "SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": "0"}
    caller = {"PATH": "/b", "HOME": "/h"}
    assert continued(recorded, caller, {}) == {"PATH": "/a", "STEPS": "3000", "CUDA_VISIBLE_DEVICES": "0"}
    assert continued(recorded, {**caller, "SLURM_JOB_ID": "2"}, {"STEPS": None, "X": "1"}) == {
        "PATH": "/a", "SLURM_JOB_ID": "2", "X": "1"}  # fmt: skip
