"""Another user on the same machine cannot run commands as you through trainguard's state: a state
folder (or a registry, or a folder above them) that someone else owns or may write is refused with
one line, and a run folder reached through a symlink out of the state folder too. Real users, made
here, and a real attack: user A prepares a shared state folder holding a run whose command records
who runs it; user B types `trainguard restart` there."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import trainguard
from tests.real.runs import run_id_from, status, tg, wait_for

pytestmark = [pytest.mark.real, pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")]

SOURCE = Path(trainguard.__file__).resolve().parent


def _user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user can reach (0755, root's), with a copy of trainguard's source in it."""
    folder = Path(tempfile.mkdtemp(prefix="tg-users-", dir="/tmp"))
    folder.chmod(0o755)
    shutil.copytree(SOURCE, folder / "src" / "trainguard", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [folder / "src", *(folder / "src").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_user(user: pwd.struct_passwd, shared: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    own_home = shared / f"home-{user.pw_name}"
    if not own_home.exists():
        own_home.mkdir(mode=0o700)
        os.chown(own_home, user.pw_uid, user.pw_gid)
    env = dict(os.environ, TRAINGUARD_HOME=str(home), HOME=str(own_home), PYTHONPATH=str(shared / "src"))
    env.pop("XDG_CACHE_HOME", None)
    env.pop("XDG_STATE_HOME", None)
    argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            sys.executable, "-m", "trainguard", *args]  # fmt: skip
    return subprocess.run(argv, env=env, cwd=shared, capture_output=True, text=True, timeout=120, check=False)


def _runnable(user: pwd.struct_passwd, shared: Path) -> None:
    probe = as_user(user, shared, shared / "probe", "--help")
    if probe.returncode != 0:
        pytest.skip(f"{user.pw_name} cannot run this Python ({sys.executable}): {probe.stderr.strip()[-200:]}")


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_shared_state_folder_cannot_run_commands_as_its_second_user(shared: Path) -> None:
    alice, bob = _user("tg-alice"), _user("tg-bob")
    _runnable(bob, shared)
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
    alice, bob = _user("tg-alice"), _user("tg-bob")
    _runnable(bob, shared)
    open_folder = shared / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)  # no sticky bit: alice may rename bob's folder away and put hers in its place
    os.chown(open_folder, alice.pw_uid, alice.pw_gid)
    line = _one_line(as_user(bob, shared, open_folder / "bob-state", "run", "--", "true"))
    assert str(open_folder) in line


def test_a_non_root_user_with_a_folder_of_their_own_runs(shared: Path) -> None:
    bob = _user("tg-bob")
    _runnable(bob, shared)
    sticky = shared / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: others cannot rename what bob makes in it
    done = as_user(bob, shared, sticky / "bob-state", "run", "--foreground", "--", "true")
    assert done.returncode == 0, done.stderr
    assert (sticky / "bob-state").stat().st_uid == bob.pw_uid


def test_a_registry_file_owned_by_someone_else_is_refused(home: Path) -> None:
    alice = _user("tg-alice")
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
