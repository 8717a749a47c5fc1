"""A run's checkpoints are its own (issue 19, items 3 and 6). Two runs of this machine on one
checkpoint folder resumed from and pruned each other's: a folder that an active run uses (or one
inside or around it, or the same folder by another name) is refused for another run, naming the run
and the fix, also when two `run` commands come at the same moment; it is free again once that run
ends; the same run goes on in it; the nodes of one job (each its own supervisor and state folder)
still share one. A run never resumes from a checkpoint another run of this machine wrote after it
began. A run continued after its checkpoint folder was removed says that it starts fresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.conftest import env_with_hook
from tests.real.runs import run_id_from, status, tg
from trainguard import Checkpointer
from trainguard.checkpoint.resume import OtherRuns, choose_resume
from trainguard.errors import UsageError
from trainguard.store.registry import Registry
from trainguard.supervisor import checkpoint_folders

pytestmark = pytest.mark.real


def _start(folder: Path, *args: str, env: dict[str, str] | None = None) -> str:
    started = tg("run", *args, "--checkpoint-dir", str(folder), "--", "sleep", "60", env=env)
    assert started.returncode == 0, started.stderr
    return run_id_from(started.stdout)


def _runs() -> list[dict]:
    return json.loads(tg("ps", "--json").stdout)


def _refused(done: subprocess.CompletedProcess, holder: str, name: str | None = None) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"run {holder}" in done.stderr and "another --checkpoint-dir" in done.stderr, done.stderr
    assert f"trainguard stop {name or holder}" in done.stderr, done.stderr
    if name:
        assert f"({name})" in done.stderr, done.stderr
    return done.stderr


def test_a_second_run_on_a_live_runs_folder_is_refused_naming_it_until_that_run_ends(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    first = _start(folder, "--name", "alpha")

    said = _refused(tg("run", "--checkpoint-dir", str(folder), "--", "sleep", "60"), first, "alpha")
    assert f"--checkpoint-dir {folder} is the checkpoint folder of run {first} (alpha)" in said
    alias = tmp_path / "alias"
    alias.symlink_to(folder)  # the same folder by another name
    _refused(tg("run", "--checkpoint-dir", str(alias), "--", "sleep", "60"), first, "alpha")
    zh = tg("run", "--checkpoint-dir", str(folder), "--", "sleep", "60", env={**os.environ, "LANG": "zh_CN.UTF-8"})
    assert zh.returncode == 2 and "检查点目录" in zh.stderr and first in zh.stderr, zh.stderr
    assert [r["id"] for r in _runs()] == [first], "a refused run leaves no record"

    assert tg("stop", first, "--grace", "1s").returncode == 0
    second = _start(folder)  # free once its run has ended
    assert tg("stop", second, "--grace", "1s").returncode == 0


@pytest.mark.parametrize("where", ["inside", "around"])
def test_a_folder_inside_or_around_a_live_runs_folder_is_refused(tmp_path: Path, where: str) -> None:
    folder = tmp_path / "outer" / "ckpt"
    holder = _start(folder)
    other = folder / "sub" if where == "inside" else tmp_path / "outer"
    said = _refused(tg("run", "--checkpoint-dir", str(other), "--", "sleep", "60"), holder)
    assert ("is inside" if where == "inside" else "holds") in said and str(folder) in said
    if where == "inside":
        assert not other.exists(), "a refused run makes no folder"
    assert tg("stop", holder, "--grace", "1s").returncode == 0


PASS_TOGETHER = """
import os, time
from pathlib import Path
from trainguard.supervisor import preflight
checked = preflight.check_checkpoint_dir
def together(path, **kwargs):
    checked(path, **kwargs)
    gate = Path(os.environ["GATE"])
    (gate / str(os.getpid())).touch()
    deadline = time.monotonic() + 20
    while len(list(gate.iterdir())) < int(os.environ["RUNS"]) and time.monotonic() < deadline:
        time.sleep(0.01)
preflight.check_checkpoint_dir = together
"""


def test_two_runs_started_together_on_one_folder_get_it_once(tmp_path: Path) -> None:
    """Four `run` commands that all passed the first check (each waits for the others there): the
    check made again inside the registry's transaction that creates a run lets one through."""
    folder, gate = tmp_path / "ckpt", tmp_path / "gate"
    gate.mkdir()
    env = env_with_hook(tmp_path, PASS_TOGETHER, GATE=str(gate), RUNS="4")
    command = [sys.executable, "-m", "trainguard", "run", "--checkpoint-dir", str(folder), "--", "sleep", "60"]
    processes = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]  # fmt: skip
    results = [(p.wait(timeout=120), *p.communicate()) for p in processes]
    assert len(list(gate.iterdir())) == 4, "every command passed the first check"
    started = [out for code, out, _ in results if code == 0]
    assert len(started) == 1, results
    winner = run_id_from(started[0])
    for code, _, err in results:
        if code != 0:
            assert code == 2 and f"run {winner}" in err and err.count("\n") == 1, err
    assert [r["id"] for r in _runs()] == [winner]
    assert tg("stop", winner, "--grace", "1s").returncode == 0


def test_the_same_run_goes_on_in_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    first = tg("run", "--foreground", "--name", "beta", "--checkpoint-dir", str(folder), "--", "true")
    assert first.returncode == 0, first.stderr
    again = tg("restart", "beta", "--foreground")
    assert again.returncode == 0 and "gone" not in again.stderr, again.stderr
    named = tg("run", "--foreground", "--name", "beta", "--checkpoint-dir", str(folder), "--", "true")
    assert named.returncode == 0 and "gone" not in named.stderr, named.stderr
    assert len(status("beta")["attempts"]) == 3


def test_an_ended_run_is_not_continued_into_a_folder_another_run_now_uses(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    assert tg("run", "--foreground", "--name", "old", "--checkpoint-dir", str(folder), "--", "true").returncode == 0
    holder = _start(folder, "--name", "new")
    _refused(tg("restart", "old"), holder, "new")
    assert status("old")["state"] == "succeeded", "a refused continuation leaves the run as it was"
    assert tg("stop", holder, "--grace", "1s").returncode == 0


def test_a_run_continued_after_its_checkpoint_folder_was_removed_says_it_starts_fresh(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    job = ["sh", "-c", 'echo "resume from: ${TRAINGUARD_RESUME_FROM:-none}"']
    assert tg("run", "--foreground", "--name", "gamma", "--checkpoint-dir", str(folder), "--", *job).returncode == 0
    (folder / "step-000000000007").mkdir()  # something there, then the whole folder goes
    subprocess.run(["rm", "-rf", str(folder)], check=True)

    again = tg("restart", "gamma", "--foreground")
    assert again.returncode == 0, again.stderr
    notes = [line for line in again.stderr.splitlines() if "is gone" in line]
    assert len(notes) == 1 and str(folder) in notes[0] and "starts fresh" in notes[0], again.stderr
    info = status("gamma")
    log = Path(info["attempts"][1]["log_path"]).read_text()
    assert "is gone" in log.splitlines()[0] and "resume from: none" in log, log
    events = [e for e in Registry(Path(os.environ["TRAINGUARD_HOME"])).events(info["id"])
              if e["kind"] == "checkpoint_dir_gone"]  # fmt: skip
    assert len(events) == 1 and events[0]["folder"] == str(folder), events
    assert folder.is_dir(), "the folder is made again for the job"


def test_the_nodes_of_one_job_share_one_folder_each_under_its_own_supervisor(tmp_path: Path) -> None:
    """Two nodes of one job simulated on this machine, as tests/launchers/test_multinode_real.py runs
    them: a state folder each, one checkpoint folder on shared storage."""
    shared = tmp_path / "shared-checkpoints"
    nodes = [{**os.environ, "TRAINGUARD_HOME": str(tmp_path / f"node{i}")} for i in (0, 1)]
    started = [(env, _start(shared, env=env)) for env in nodes]
    for env, run_id in started:
        assert tg("stop", run_id, "--grace", "1s", env=env).returncode == 0


def _save(folder: Path, step: int, writer: str | None) -> None:
    ckpt = Checkpointer(folder, every=None, handle_signals=False, keep=10)
    ckpt.save({"step": step}, step, blocking=True)
    ckpt.close()
    manifest = folder / f"step-{step:012d}" / "manifest.json"
    content = json.loads(manifest.read_text())
    content.pop("run", None)
    if writer is not None:
        content["run"] = writer
    manifest.write_text(json.dumps(content))


def test_a_run_never_resumes_from_what_another_run_of_this_machine_wrote_after_it_began(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _save(folder, 1, "old0")  # an ended run's, older than the resuming run: the folder was handed over
    began = time.time()
    time.sleep(0.05)
    _save(folder, 2, "mine")
    _save(folder, 3, "intr")  # another run's, written while ours ran
    _save(folder, 4, None)  # written outside trainguard: nobody's

    others = OtherRuns(ids=frozenset({"old0", "intr"}), since=began)
    assert choose_resume(str(folder), None).path.endswith("step-000000000004")
    os.unlink(folder / "step-000000000004" / "manifest.json")  # now incomplete
    choice = choose_resume(str(folder), None, other_runs=others)
    assert choice.path.endswith("step-000000000002"), choice
    assert [s.split(": ", 1)[1] for s in choice.skipped] == [
        "no manifest.json (the save did not finish)",
        "written by run intr, another run of this machine",
    ]
    (folder / "step-000000000002" / "manifest.json").unlink()
    assert choose_resume(str(folder), None, other_runs=others).path.endswith("step-000000000001")
    assert choose_resume(str(tmp_path / "gone"), None).folder_missing


def test_the_other_runs_are_those_of_this_machine_and_the_check_holds_inside_the_creating_transaction(
    tmp_path: Path,
) -> None:
    registry = Registry(Path(os.environ["TRAINGUARD_HOME"]))
    folder = str(tmp_path / "ckpt")
    mine = registry.create_run(["true"], name=None, cwd=str(tmp_path), options={"checkpoint_dir": folder})
    elsewhere = registry.create_run(["true"], name=None, cwd=str(tmp_path), options={"checkpoint_dir": folder})
    with registry._transaction() as db:  # a node of the job on another machine, sharing a registry on a shared home
        db.execute("UPDATE runs SET host = 'node-7' WHERE id = ?", (elsewhere.id,))
    ended = registry.create_run(["true"], name=None, cwd=str(tmp_path), options={"checkpoint_dir": folder})
    registry.set_state(ended.id, "succeeded")

    others = checkpoint_folders.other_runs(registry, registry.get(mine.id))
    assert others.ids == {ended.id} and others.since == mine.created_at
    found = checkpoint_folders.holder(registry.all(), folder + "/x")
    assert found is not None and found[0].id == mine.id and found[1] == "inside"
    assert checkpoint_folders.holder(registry.all(), folder, except_run=mine.id) is None

    def check(run_id: str, run_dir: Path) -> None:
        checkpoint_folders.refuse_if_held(registry, folder)

    with pytest.raises(UsageError, match=f"run {mine.id}"):
        registry.create_run(["true"], name=None, cwd=str(tmp_path), options={}, before_visible=check)
    assert len(registry.all()) == 3, "the refused run left no record"


OWN_FOLDER_JOB = """
import time
from trainguard import Checkpointer
ckpt = Checkpointer("ckpt", every=None, every_steps=5, keep=2)  # relative: the job's working folder
state = ckpt.load_latest()
print("training from step", state["step"] + 1 if state else 0, flush=True)
for step in range(100_000):
    time.sleep(0.02)
    ckpt.maybe_save(step, lambda: {"step": step})
    if ckpt.stop_requested:
        print("saved and left at", step, flush=True)
        break
ckpt.close()
"""


def test_a_folder_the_code_names_is_one_live_runs_too(tmp_path: Path) -> None:
    """The same script run twice in one folder, `Checkpointer("ckpt")` in its code (no --checkpoint-dir
    for trainguard to check): the second resumed from the first's checkpoint and pruned its stop save.
    The second run's Checkpointer is refused, naming the first; once that one ends the folder is free."""
    job = tmp_path / "own.py"
    job.write_text(OWN_FOLDER_JOB)
    first = run_id_from(tg("run", "--name", "own1", "--", sys.executable, str(job), cwd=tmp_path).stdout)
    deadline = time.monotonic() + 30
    while not list((tmp_path / "ckpt").glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    second = tg("run", "--foreground", "--name", "own2", "--", sys.executable, str(job), cwd=tmp_path)
    assert second.returncode == 78, second.stdout[-2000:]  # fix it first: not restarted
    assert f"is the checkpoint folder of run {first}, which is running" in second.stdout, second.stdout[-2000:]
    assert "training from step" not in second.stdout  # it never loaded the first run's checkpoint
    assert tg("stop", "own1").returncode == 0
    saved = int(tg("logs", "own1").stdout.split("saved and left at ")[1].split()[0])
    assert (tmp_path / "ckpt" / f"step-{saved:012d}").is_dir()  # the first run's stop save is there
    assert not list((tmp_path / "ckpt").glob(".live-*"))  # each let go of its claim
    third = run_id_from(tg("run", "--name", "own3", "--", sys.executable, str(job), cwd=tmp_path).stdout)
    deadline = time.monotonic() + 30
    while "training from step" not in (said := tg("logs", third).stdout) and time.monotonic() < deadline:
        time.sleep(0.1)
    tg("stop", third)
    assert f"training from step {saved + 1}" in said and "is the checkpoint folder of run" not in said, said[-2000:]  # the folder is free
    assert status(first)["state"] == "stopped"
