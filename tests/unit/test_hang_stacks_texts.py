"""What the job is given for a hang's stacks (the start-up hook first on its PYTHONPATH, the user's
entries after it, trainguard's signal and folder) and what the attempt's log says of the dump: which
way the stacks came, or why none could be had. Pure functions."""

from __future__ import annotations

import os

from trainguard.supervisor.job import JOB_SITE_DIR, STACKS_SIGNAL, job_environment
from trainguard.supervisor.stacks import FAULTHANDLER, PY_SPY, ProcessStacks, faulthandler_dumps, hang_marker

FILES = {"run_id": "ab12", "attempt": 2, "restart_cause": None, "checkpoint_dir": "/ck", "resume_from": None,
         "batch_scale": 1.0, "error_file": "/e.json", "progress_file": "/p.json"}  # fmt: skip


def test_the_hook_goes_first_on_the_jobs_pythonpath_and_the_users_entries_stay_after_it() -> None:
    env = job_environment({"PYTHONPATH": "/mine:/theirs"}, **FILES, stacks_dir="/run/attempt-2.stacks")
    assert env["PYTHONPATH"] == os.pathsep.join([JOB_SITE_DIR, "/mine", "/theirs"])
    assert env["TRAINGUARD_STACKS_DIR"] == "/run/attempt-2.stacks"
    assert env["TRAINGUARD_STACKS_SIGNAL"] == str(STACKS_SIGNAL) and STACKS_SIGNAL > 34  # a real-time signal
    # no empty entry (Python would read it as the working folder), never twice
    assert job_environment({}, **FILES, stacks_dir="/s")["PYTHONPATH"] == JOB_SITE_DIR
    assert job_environment({"PYTHONPATH": ""}, **FILES, stacks_dir="/s")["PYTHONPATH"] == JOB_SITE_DIR
    again = job_environment({"PYTHONPATH": env["PYTHONPATH"]}, **FILES, stacks_dir="/s")["PYTHONPATH"]
    assert again == env["PYTHONPATH"]


def test_without_a_stacks_folder_the_job_gets_no_hook() -> None:
    env = job_environment({"PYTHONPATH": "/mine", "TRAINGUARD_STACKS_DIR": "/stale"}, **FILES)
    assert env["PYTHONPATH"] == "/mine" and "TRAINGUARD_STACKS_DIR" not in env
    assert "TRAINGUARD_STACKS_SIGNAL" not in env


def test_the_marker_says_which_way_the_stacks_came() -> None:
    stacks = {1: ProcessStacks("Thread 1", PY_SPY), 2: ProcessStacks("Thread 2", FAULTHANDLER), 3: ProcessStacks()}
    text = hang_marker(stacks, True, "3", "/run/hang-attempt-1.txt")
    assert (
        text.en
        == "no progress for 3 s; stacks of 2 of 3 processes (py-spy and faulthandler) in /run/hang-attempt-1.txt"
    )
    assert "3 个进程中 2 个的调用栈（py-spy、faulthandler）见 /run/hang-attempt-1.txt" in text.zh


def test_the_marker_says_why_no_stacks_could_be_dumped(tmp_path) -> None:
    pids = {os.getpid(): ProcessStacks(notes=("py-spy failed: Permission Denied",))}
    faulthandler_dumps(pids, str(tmp_path))  # no file of this process: never sent the signal
    assert "not armed for faulthandler" in pids[os.getpid()].notes[-1]
    text = hang_marker(pids, True, "3", "/run/hang-attempt-1.txt")
    assert text.en.startswith("no progress for 3 s; no stacks could be dumped: py-spy failed (no ptrace rights?)")
    assert "no process has trainguard's faulthandler armed" in text.en and "py-spy 失败" in text.zh
    missing = hang_marker({7: ProcessStacks()}, False, "3", "/f")
    assert "py-spy is not installed (pip install py-spy)" in missing.en and "未安装 py-spy" in missing.zh
    assert "no process of the job was left" in hang_marker({}, False, "3", "/f").en
