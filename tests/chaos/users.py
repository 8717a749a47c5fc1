"""Acting as other users of this machine in the chaos tests: users made for the test, a folder every
user can reach holding a copy of trainguard's source, and trainguard run as one of them."""

from __future__ import annotations

import contextlib
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

SOURCE = Path(trainguard.__file__).resolve().parent


def user_named(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


@contextlib.contextmanager
def shared_folder() -> Iterator[Path]:
    """A folder every user can reach (0755, root's), with a copy of trainguard's source in it."""
    folder = Path(tempfile.mkdtemp(prefix="tg-users-", dir="/tmp"))
    folder.chmod(0o755)
    shutil.copytree(SOURCE, folder / "src" / "trainguard", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [folder / "src", *(folder / "src").rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        yield folder
    finally:
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


def skip_unless_runnable(user: pwd.struct_passwd, shared: Path) -> None:
    probe = as_user(user, shared, shared / "probe", "--help")
    if probe.returncode != 0:
        pytest.skip(f"{user.pw_name} cannot run this Python ({sys.executable}): {probe.stderr.strip()[-200:]}")


