"""`trainguard rm` and `trainguard prune` on real runs: an ended run's record and logs go, its
checkpoints only when asked (and never a folder another run records), with the space freed; a run that
is not ended, or whose supervisor still holds it, is refused and nothing is removed; prune takes the runs
that ended more than DUR ago, lists them with --dry-run, and finishes what a removal cut short left."""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.real.runs import TICKER, run_id_from, script, status, tg, wait_for

pytestmark = pytest.mark.real

MIB = 1024 * 1024
# A job that saves one checkpoint of SAVE_MIB MiB of random bytes (nothing to compress or skip) in its
# checkpoint folder, then ends well.
SAVER = """
    import os, pathlib
    folder = pathlib.Path(os.environ["TRAINGUARD_CHECKPOINT_DIR"]) / "step-1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.bin").write_bytes(os.urandom(int(os.environ.get("SAVE_MIB", "4")) * 1024 * 1024))
    print("saved step 1", flush=True)
"""


def ended_run(tmp_path: Path, *options: str, save_mib: int = 4, cwd: Path | None = None) -> dict:
    job = script(tmp_path, "saver.py", SAVER)
    started = tg("run", *options, "--", sys.executable, job, env={**os.environ, "SAVE_MIB": str(save_mib)}, cwd=cwd)
    assert started.returncode == 0, started.stderr
    run_id = run_id_from(started.stdout)
    wait_for(lambda: status(run_id)["state"] == "succeeded", 60, "the run to succeed")
    return status(run_id)


def running_run(tmp_path: Path, *options: str) -> dict:
    started = tg("run", *options, "--", sys.executable, script(tmp_path, "ticker.py", TICKER))
    assert started.returncode == 0, started.stderr
    return status(run_id_from(started.stdout))


def freed(output: str) -> int:
    """The bytes the summary line says were (or would be) freed."""
    match = re.search(r"(?:freed|freeing) ([0-9.]+) (B|KiB|MiB|GiB)", output)
    assert match, output
    return int(float(match.group(1)) * {"B": 1, "KiB": 1024, "MiB": MIB, "GiB": 1024 * MIB}[match.group(2)])


def is_recorded(run_id: str) -> bool:
    done = tg("status", run_id, "--json")
    assert done.returncode in (0, 1, 2), done.stderr
    return done.returncode != 2


def test_rm_removes_record_and_logs_and_keeps_checkpoints_unless_asked(tmp_path: Path, home: Path) -> None:
    kept = ended_run(tmp_path, "--name", "kept")
    run_dir = Path(kept["log_path"]).parent
    checkpoints = Path(kept["checkpoint_dir"])
    assert checkpoints.parent == run_dir and (checkpoints / "step-1" / "model.bin").exists()
    done = tg("rm", "kept")
    assert done.returncode == 0, done.stderr
    assert f"removed run {kept['id']} (kept): record and logs" in done.stdout
    assert f"checkpoints kept in {checkpoints}" in done.stdout
    assert not is_recorded(kept["id"]) and tg("logs", kept["id"]).returncode == 2
    assert not list(run_dir.glob("*.log")) and (checkpoints / "step-1" / "model.bin").stat().st_size == 4 * MIB
    assert freed(done.stdout) < MIB  # the logs only: the checkpoint stays

    gone = ended_run(tmp_path, "--name", "gone", save_mib=6)
    done = tg("rm", gone["id"][:6], "--checkpoints")  # a unique prefix of its id
    assert done.returncode == 0, done.stderr
    assert not Path(gone["log_path"]).parent.exists() and not is_recorded(gone["id"])
    assert re.search(r"checkpoints 6\.\d MiB", done.stdout) and freed(done.stdout) >= 6 * MIB, done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("removed 1 run(s), freed ")


def test_rm_checkpoints_never_takes_a_folder_another_run_records(tmp_path: Path, home: Path) -> None:
    shared = tmp_path / "shared-ckpt"
    mine = ("--checkpoint-dir", str(shared), "--checkpoint-glob", "step-*/model.bin")  # the saver's own format
    first = ended_run(tmp_path, "--name", "first", *mine)
    second = ended_run(tmp_path, "--name", "second", *mine)
    done = tg("rm", "first", "--checkpoints")
    assert done.returncode == 0, done.stderr
    assert f"checkpoints kept in {shared} (run {second['id']} records it too)" in done.stdout
    assert (shared / "step-1" / "model.bin").exists() and not is_recorded(first["id"])
    # Once no run records it, the last one's --checkpoints takes it, outside the state folder too.
    done = tg("rm", "second", "--checkpoints")
    assert done.returncode == 0, done.stderr
    assert not shared.exists() and freed(done.stdout) >= 4 * MIB
    # A job that saves into its working folder: --checkpoints never takes the folder holding the code.
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('the code')\n")
    here = ended_run(tmp_path, "--checkpoint-dir", ".", cwd=project)
    done = tg("rm", here["id"], "--checkpoints")
    assert done.returncode == 0, done.stderr
    assert f"checkpoints kept in {project} (it holds the run's working folder)" in done.stdout
    assert (project / "train.py").exists() and (project / "step-1" / "model.bin").exists()
    assert not Path(here["log_path"]).parent.exists()


def test_rm_checkpoints_never_takes_what_is_not_a_checkpoint(tmp_path: Path, home: Path) -> None:
    """`--checkpoint-dir data`: `rm --checkpoints` took the whole folder, the user's data with it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("the user's data\n")
    run = ended_run(tmp_path, "--name", "data", "--checkpoint-dir", str(data), "--checkpoint-glob", "step-*/model.bin")
    listed = tg("rm", "data", "--checkpoints", "--dry-run")
    assert listed.returncode == 0 and "it holds what is not a checkpoint (train.csv)" in listed.stdout, listed.stdout
    done = tg("rm", "data", "--checkpoints")
    assert done.returncode == 0, done.stderr
    assert f"checkpoints kept in {data} (it holds what is not a checkpoint (train.csv)" in done.stdout, done.stdout
    assert (data / "train.csv").read_text() == "the user's data\n" and (data / "step-1" / "model.bin").exists()
    assert not is_recorded(run["id"])
    # A folder of nothing but checkpoints goes, as asked.
    (data / "train.csv").unlink()
    again = ended_run(tmp_path, "--name", "again", "--checkpoint-dir", str(data), "--checkpoint-glob", "step-*/model.bin")
    assert tg("rm", "again", "--checkpoints").returncode == 0 and not data.exists() and not is_recorded(again["id"])


def test_rm_of_a_running_run_is_refused_and_removes_nothing(tmp_path: Path, home: Path) -> None:
    ended = ended_run(tmp_path, "--name", "done")
    live = running_run(tmp_path, "--name", "live")
    try:
        for args in (("rm", "done", "live"), ("rm", "live", "--dry-run"), ("rm", "live", "--checkpoints")):
            refused = tg(*args)
            assert refused.returncode == 2, refused
            assert refused.stderr.count("\n") == 1 and f"run {live['id']} (live) is running" in refused.stderr
            assert "trainguard stop" in refused.stderr and refused.stdout == ""
        assert is_recorded(ended["id"]) and Path(ended["log_path"]).parent.joinpath("attempt-1.log").exists()
        assert status("live")["state"] == "running" and Path(live["log_path"]).exists()
        zh = tg("rm", "live", env={**os.environ, "LANG": "zh_CN.UTF-8"})
        assert zh.returncode == 2 and "运行中" in zh.stderr and "没有删除任何东西" in zh.stderr
    finally:
        assert tg("stop", "live", "--grace", "2s").returncode == 0
    # Stopped, it can go at once: rm waits the moment its supervisor takes to let go of it.
    done = tg("rm", "live", "done")
    assert done.returncode == 0, done.stderr
    assert "removed 2 run(s)" in done.stdout and not is_recorded(live["id"]) and not is_recorded(ended["id"])


def test_a_run_whose_supervisor_still_holds_it_is_refused(tmp_path: Path, home: Path) -> None:
    run = ended_run(tmp_path, "--name", "held")
    lock = Path(run["log_path"]).parent / "supervisor.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(lock)!r}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "os.pwrite(fd, f'{os.getpid()} \\n'.encode(), 0)\nprint('held', flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = tg("rm", "held")
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused
        assert f"run {run['id']} (held) is still held by supervisor {holder.pid}" in refused.stderr
        assert is_recorded(run["id"]) and lock.exists()
        pruned = tg("prune", "--older-than", "1s")  # prune skips it, says so, and fails nothing
        assert pruned.returncode == 0 and "skipped run" in pruned.stderr and is_recorded(run["id"])
    finally:
        holder.kill()
        holder.wait()


def test_prune_lists_with_dry_run_and_removes_without(tmp_path: Path, home: Path) -> None:
    old_one = ended_run(tmp_path, "--name", "old-one")
    old_two = ended_run(tmp_path, "--name", "old-two")
    time.sleep(2.5)
    live = running_run(tmp_path, "--name", "live")
    try:
        assert "nothing to remove: no run ended more than 1h00m ago" in tg("prune", "--older-than", "1h").stdout
        listed = tg("prune", "--older-than", "2s", "--dry-run", "--checkpoints")
        assert listed.returncode == 0, listed.stderr
        assert f"would remove run {old_one['id']} (old-one)" in listed.stdout
        assert f"would remove run {old_two['id']} (old-two)" in listed.stdout and live["id"] not in listed.stdout
        assert "would remove 2 run(s), freeing " in listed.stdout and freed(listed.stdout) >= 8 * MIB
        assert is_recorded(old_one["id"]) and Path(old_two["checkpoint_dir"]).exists()  # a dry run removes nothing
        done = tg("prune", "--older-than", "2s")
        assert done.returncode == 0, done.stderr
        assert "removed 2 run(s)" in done.stdout and not is_recorded(old_one["id"]) and not is_recorded(old_two["id"])
        assert status("live")["state"] == "running"
        zh = tg("prune", "--older-than", "1s", "--dry-run", env={**os.environ, "LANG": "zh_CN.UTF-8"})
        assert zh.returncode == 0 and "没有可删除的" in zh.stdout, zh  # the kept checkpoints stay unless asked
    finally:
        tg("stop", "live", "--grace", "2s")


def test_prune_finishes_a_removal_cut_short_after_the_record_went(tmp_path: Path, home: Path) -> None:
    run = ended_run(tmp_path, "--name", "cut")
    run_dir = Path(run["log_path"]).parent
    with sqlite3.connect(home / "runs.sqlite") as db:  # as a crash right after the record's transaction leaves it
        for table, column in (("events", "run_id"), ("samples", "run_id"), ("attempts", "run_id"), ("runs", "id")):
            db.execute(f"DELETE FROM {table} WHERE {column} = ?", (run["id"],))
    assert not is_recorded(run["id"]) and run_dir.exists()
    os.utime(run_dir, (time.time() - 120, time.time() - 120))
    assert "nothing to remove" in tg("prune", "--older-than", "10m").stdout  # changed too recently for that
    done = tg("prune", "--older-than", "1m")
    assert done.returncode == 0, done.stderr
    assert f"removed what the removal of run {run['id']} left: files" in done.stdout
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints"]  # its checkpoints only when asked
    os.utime(run_dir, (time.time() - 120, time.time() - 120))
    done = tg("prune", "--older-than", "1m", "--checkpoints")
    assert done.returncode == 0 and not run_dir.exists() and freed(done.stdout) >= 4 * MIB, done


def test_a_folder_no_record_names_but_a_supervisor_holds_is_never_touched(tmp_path: Path, home: Path) -> None:
    ended_run(tmp_path)  # the state folder, with its registry
    folder = home / "runs" / "0badc0de"
    folder.mkdir()
    (folder / "attempt-1.log").write_text("a supervisor whose record vanished puts it back\n")
    fd = os.open(folder / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        os.utime(folder, (time.time() - 120, time.time() - 120))
        done = tg("prune", "--older-than", "1m", "--checkpoints")
        assert done.returncode == 0 and "0badc0de" not in done.stdout and (folder / "attempt-1.log").exists()
    finally:
        os.close(fd)


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, home: Path) -> None:
    ended_run(tmp_path, "--name", "here")
    for args, message in ((("prune", "--older-than", "soon"), "--older-than: not a duration: 'soon'"),
                          (("prune", "--older-than", "0"), "--older-than: a duration must be positive"),
                          (("prune",), "prune needs --older-than DUR"),
                          (("rm", "here", "nosuch"), "no run has the name or id 'nosuch'"),
                          (("rm",), "Missing argument 'RUN...'")):  # fmt: skip
        done = tg(*args)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, (args, done)
        assert "Traceback" not in done.stderr
    assert is_recorded("here")  # an unknown run among those given: nothing was removed
