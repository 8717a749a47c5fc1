"""Another user on the same machine cannot run commands as you through trainguard's state: a state
folder (or a registry, or a folder above them) that someone else owns or may write is refused with
one line, and a run folder reached through a symlink out of the state folder too. Real users, made
here, and a real attack: user A prepares a shared state folder holding a run whose command records
who runs it; user B types `trainguard restart` there."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.chaos.users import as_user, skip_unless_runnable, user_named
from tests.real.runs import run_id_from, status, tg, wait_for

pytestmark = [pytest.mark.real, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")]

def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_shared_state_folder_cannot_run_commands_as_its_seconduser_named(shared: Path) -> None:
    alice, bob = user_named("tg-alice"), user_named("tg-bob")
    skip_unless_runnable(bob, shared)
    trap = shared / "tgshared"
    pwned = shared / "pwned.txt"
    trap.mkdir(mode=0o777)
    trap.chmod(0o777)
    os.chown(trap, alice.pw_uid, alice.pw_gid)
    pwned.touch(mode=0o666)
    pwned.chmod(0o666)
    made = as_user(alice, shared, trap, "run", "--name", "victim", "--foreground", "--restart", "never", "--",
                   "sh", "-c", f"id -u > {pwned}; exit 1")  # fmt: skip
    assert made.returncode != 0 and pwned.read_text().strip() == str(alice.pw_uid), made.stderr
    for path in [trap, *trap.rglob("*")]:  # alice opens everything up for bob
        if not path.is_symlink():
            path.chmod(0o777 if path.is_dir() else 0o666)
    pwned.write_text("")
    line = _one_line(as_user(bob, shared, trap, "restart", "victim"))
    assert "tg-alice" in line and str(trap) in line
    assert pwned.read_text().strip() != str(bob.pw_uid), "alice's command ran as bob"
    _one_line(as_user(bob, shared, trap, "ps"))


def test_a_state_folder_inside_a_folder_others_may_write_is_refused(shared: Path) -> None:
    alice, bob = user_named("tg-alice"), user_named("tg-bob")
    skip_unless_runnable(bob, shared)
    open_folder = shared / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)  # no sticky bit: alice may rename bob's folder away and put hers in its place
    os.chown(open_folder, alice.pw_uid, alice.pw_gid)
    line = _one_line(as_user(bob, shared, open_folder / "bob-state", "run", "--", "true"))
    assert str(open_folder) in line


def test_a_non_root_user_with_a_folder_of_their_own_runs(shared: Path) -> None:
    bob = user_named("tg-bob")
    skip_unless_runnable(bob, shared)
    sticky = shared / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: others cannot rename what bob makes in it
    done = as_user(bob, shared, sticky / "bob-state", "run", "--foreground", "--", "true")
    assert done.returncode == 0, done.stderr
    assert (sticky / "bob-state").stat().st_uid == bob.pw_uid


def test_a_registry_file_owned_by_someone_else_is_refused(home: Path) -> None:
    alice = user_named("tg-alice")
    assert tg("run", "--foreground", "--", "true").returncode == 0
    os.chown(home / "runs.sqlite", alice.pw_uid, alice.pw_gid)
    line = _one_line(tg("ps"))
    assert "runs.sqlite" in line and "tg-alice" in line


def test_a_run_folder_that_leads_out_of_the_state_folder_is_refused(tmp_path: Path, home: Path) -> None:
    run_id = run_id_from(tg("run", "--", "true").stdout)
    run_dir = home / "runs" / run_id
    wait_for(lambda: status(run_id)["state"] == "succeeded", what="the run to end")
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run_dir, elsewhere)
    run_dir.symlink_to(elsewhere)
    line = _one_line(tg("status", run_id))
    assert "outside" in line
