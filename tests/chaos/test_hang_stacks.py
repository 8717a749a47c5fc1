"""A hang's stacks without py-spy (not installed, or not allowed to attach): every Python process of
the job, forked DataLoader-style workers among them, writes its own stacks through faulthandler on
trainguard's signal, as any user. A user's own sitecustomize still runs; a process that does not
catch the signal (a shell, `sleep`) is never sent it, since a real-time signal would kill it. Real
hangs under the real `trainguard run`, py-spy taken off PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.real.runs import script, tg
from trainguard.supervisor.job import JOB_SITE_DIR, STACKS_SIGNAL

pytestmark = pytest.mark.real

HANG_RUN = ("run", "--foreground", "--hang-timeout", "3s", "--max-restarts", "0", "--grace", "1s", "--")

# The main process and a forked child (as a DataLoader's fork workers are made) each sleep in a loop
# of their own, printing nothing: a hang.
FORKING_JOB = """
import os, time

def worker_sleeps_in_its_loop():
    while True:
        time.sleep(0.2)

def main_sleeps_in_its_loop():
    while True:
        time.sleep(0.2)

worker = os.fork()
if worker == 0:
    worker_sleeps_in_its_loop()
print("main", os.getpid(), "worker", worker, flush=True)
main_sleeps_in_its_loop()
"""


def path_without_py_spy(extra: str | None = None) -> str:
    """PATH without any folder holding py-spy (the job's Python is named by its absolute path)."""
    kept = [folder for folder in os.environ["PATH"].split(os.pathsep) if not shutil.which("py-spy", path=folder)]
    path = os.pathsep.join(([extra] if extra else []) + kept)
    assert shutil.which("py-spy", path=path) in (None, os.path.join(extra or "", "py-spy"))
    return path


def hung_run(home: Path, *command: str, **env: str) -> tuple[dict, str, str]:
    """A run whose only attempt hangs: its status, its hang stacks file, its attempt's log."""
    done = tg(*HANG_RUN, *command, env={**os.environ, "PATH": path_without_py_spy(), **env}, timeout=120)
    assert done.returncode == 75, done.stderr  # tempfail: a hang, no restart left
    run = json.loads(tg("ps", "--json").stdout)[0]
    attempt = run["attempts"][0]
    assert attempt["cause"] == "hang", attempt
    stacks = (home / "runs" / run["id"] / "hang-attempt-1.txt").read_text()
    return run, stacks, Path(attempt["log_path"]).read_text()


def sections(stacks: str) -> dict[int, str]:
    """The hang stacks file's part of each process, by pid."""
    return {int(part.split(" ", 1)[0]): part for part in stacks.split("--- process ")[1:]}


def test_a_hang_without_py_spy_holds_the_stacks_of_the_job_and_its_forked_worker(tmp_path: Path, home: Path) -> None:
    run, stacks, log = hung_run(home, sys.executable, script(tmp_path, "hang.py", FORKING_JOB))
    assert "main_sleeps_in_its_loop" in stacks and "worker_sleeps_in_its_loop" in stacks, stacks
    main, worker = (int(word) for word in log.split("main ", 1)[1].split()[:3:2])
    by_pid = sections(stacks)
    assert "main_sleeps_in_its_loop" in by_pid[main] and "worker_sleeps_in_its_loop" in by_pid[worker], stacks
    assert "Python stacks by faulthandler (py-spy is not installed" in by_pid[worker]
    assert "stacks of 2 of 2 processes (faulthandler) in " in log, log
    assert not (home / "runs" / run["id"] / "attempt-1.stacks").exists()  # read into the stacks file


def test_a_py_spy_that_cannot_attach_leaves_the_stacks_to_faulthandler(tmp_path: Path, home: Path) -> None:
    refusing = tmp_path / "bin"
    refusing.mkdir()
    fake = refusing / "py-spy"  # as py-spy answers without ptrace rights
    fake.write_text("#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated permissions'\nexit 1\n")
    fake.chmod(0o755)
    job = script(tmp_path, "hang.py", FORKING_JOB)
    done = tg(*HANG_RUN, sys.executable, job, env={**os.environ, "PATH": path_without_py_spy(str(refusing))})
    assert done.returncode == 75, done.stderr
    run = json.loads(tg("ps", "--json").stdout)[0]
    stacks = (home / "runs" / run["id"] / "hang-attempt-1.txt").read_text()
    assert "main_sleeps_in_its_loop" in stacks and "worker_sleeps_in_its_loop" in stacks, stacks
    assert "py-spy failed: Error: Permission Denied" in stacks


def test_a_users_own_sitecustomize_still_runs_in_the_job(tmp_path: Path, home: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marker = tmp_path / "marker"
    (hooks / "sitecustomize.py").write_text(f"import os\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n")
    job = script(tmp_path, "show.py", """
        import os, sys
        print("pid", os.getpid())
        print("sitecustomize", sys.modules["sitecustomize"].__file__)
        print("PYTHONPATH", os.environ["PYTHONPATH"])
        print("trainguard's folder on sys.path", any(p.endswith("_jobsite") for p in sys.path))
    """)  # fmt: skip
    users_path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    done = tg("run", "--foreground", "--", sys.executable, job, env={**os.environ, "PYTHONPATH": users_path})
    assert done.returncode == 0, done.stderr
    run = json.loads(tg("ps", "--json").stdout)[0]
    log = Path(run["attempts"][0]["log_path"]).read_text()
    assert log.split("pid ", 1)[1].split()[0] in marker.read_text().split()  # the job's Python ran the user's hook
    assert f"sitecustomize {hooks / 'sitecustomize.py'}" in log
    assert f"PYTHONPATH {JOB_SITE_DIR}{os.pathsep}{users_path}\n" in log, log  # the user's entries after it
    assert "trainguard's folder on sys.path False" in log


def test_a_non_python_job_hangs_without_being_killed_by_the_signal(tmp_path: Path, home: Path) -> None:
    run, stacks, log = hung_run(home, "sh", "-c", "sleep 100; echo not reached")
    attempt = run["attempts"][0]
    assert attempt["signal"] != STACKS_SIGNAL, attempt  # stopped by trainguard, not by the dump
    assert stacks.count("--- process ") >= 1 and "no Python stacks: py-spy is not installed" in stacks, stacks
    assert "not armed for faulthandler" in stacks
    assert "no stacks could be dumped: py-spy is not installed" in log, log
    assert "no process has trainguard's faulthandler armed" in log


def test_a_hang_of_a_non_root_user_without_py_spy_holds_the_stacks(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    python, deps = _python_anyone_may_run()
    shared = Path(tempfile.mkdtemp(prefix="tg-hang-", dir="/tmp"))
    try:
        shutil.copytree(Path(__file__).parents[2] / "src" / "trainguard", shared / "src" / "trainguard",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        job = shared / "hang.py"
        job.write_text(FORKING_JOB)
        state = shared / "state"
        state.mkdir(mode=0o700)
        os.chown(state, 65534, 65534)
        for path in [shared, *shared.rglob("*")]:
            if path != state:
                path.chmod(0o755 if path.is_dir() else 0o644)
        env = {**os.environ, "PATH": path_without_py_spy(), "TRAINGUARD_HOME": str(state), "HOME": str(state),
               "PYTHONPATH": os.pathsep.join([str(shared / "src"), deps])}  # fmt: skip
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-m", "trainguard"]
        done = subprocess.run([*as_nobody, *HANG_RUN, python, str(job)], env=env, cwd=shared, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 75, done.stderr
        [run_dir] = (state / "runs").iterdir()
        stacks = (run_dir / "hang-attempt-1.txt").read_text()
        assert (run_dir / "hang-attempt-1.txt").stat().st_uid == 65534
        assert "main_sleeps_in_its_loop" in stacks and "worker_sleeps_in_its_loop" in stacks, stacks
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _python_anyone_may_run() -> tuple[str, str]:
    """A Python of this version that every user may run, and the folder of trainguard's dependencies
    they may read (the test's own Python may sit under root's home, out of their reach)."""
    import psutil

    deps = str(Path(psutil.__file__).parent.parent)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        # as trainguard checks a command (access(2)), not only whether the kernel runs it
        probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                'test -x "$0" && exec "$0" -c "import psutil, rich, click"', candidate],
                               env={**os.environ, "PYTHONPATH": deps}, capture_output=True, check=False)  # fmt: skip
        if probe.returncode == 0:
            return candidate, deps
    pytest.skip(f"no {version} that user nobody may run with trainguard's dependencies ({deps})")


@pytest.mark.slow
def test_a_torchrun_rank_hanging_without_py_spy_is_found_from_faulthandler_stacks(tmp_path: Path, home: Path) -> None:
    pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
    from tests.launchers.test_torchrun_real import torchrun

    done, info, _out = torchrun(tmp_path, "--hang-timeout", "20s", "--grace", "3s", fault="hang",
                                PATH=path_without_py_spy())  # fmt: skip
    assert done.returncode == 0, done.stderr
    first = info["attempts"][0]
    assert first["cause"] == "hang", first["diagnosis"]
    assert first["diagnosis"]["first_failure"]["rank"] == 1  # rank 0 waits for it inside all_reduce
    stacks = (home / "runs" / info["id"] / "hang-attempt-1.txt").read_text()
    # each rank's processes: its main one, and its checkpoint writer
    by_rank = {rank: "".join(text for text in sections(stacks).values() if f"(rank {rank}," in text) for rank in (0, 1)}
    assert "all_reduce" in by_rank[0] and "all_reduce" not in by_rank[1], stacks
    assert "Python stacks by faulthandler" in by_rank[0] and "train.py" in by_rank[1]
