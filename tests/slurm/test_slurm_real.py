"""`srun trainguard run --foreground --requeue` on a real local Slurm cluster (tests/slurm/cluster.py):
a job killed at its time limit saves, is requeued and resumes at the saved step until it finishes; the
pre-timeout signal (`--signal=B:USR1@...`) becomes a save and a requeue; a requeue from outside
resumes; a bug (exit 78) and a `scancel` are not requeued. Slurm's time limits are whole minutes and
enforced every ~30 s, so these take minutes: the slow tier."""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.real.loader_jobs import SLOW_LOADER_HEAD
from tests.real.runs import wait_for
from tests.slurm.cluster import LocalSlurm

pytestmark = [pytest.mark.slow, pytest.mark.real]

# A training loop that saves every 20 steps and at once on SIGTERM/SIGUSR1, and says when it started
# (at which step) and when it saved, in wall time: the requeue-to-resume time is read from these.
TRAIN = """
    import os, subprocess, sys, time
    from trainguard import Checkpointer
    total = int(sys.argv[1])
    # a child without a SIGUSR1 handler, as a DataLoader worker is: a save request must not kill it
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    ckpt = Checkpointer(every=None, every_steps=20)
    state = ckpt.load_latest()
    start = state["step"] + 1 if state else 0
    print(f"start step={start} slurm_restart={os.environ.get('SLURM_RESTART_COUNT', '0')} at={time.time():.3f}", flush=True)
    if len(sys.argv) > 2 and sys.argv[2] == "bug":
        print({"cat": 0}["bird"])
    for step in range(start, total):
        time.sleep(0.1)
        ckpt.maybe_save(step, lambda: {"step": step})
        if ckpt.stop_requested:
            print(f"saved step={step} at={time.time():.3f} helper_alive={helper.poll() is None}", flush=True)
            sys.exit(0)
    ckpt.save({"step": total - 1}, total - 1)
    ckpt.wait()
    print(f"finished step={total - 1}", flush=True)
"""

# The most common loop: a DataLoader with forked workers and a periodic save 30 minutes away, so that
# only the stop's own save keeps its work.
TRAIN_LOADER = SLOW_LOADER_HEAD + """
    if __name__ == "__main__":
        total = int(sys.argv[1])
        ckpt = Checkpointer(every="30m")
        state = ckpt.load_latest()
        start = step = state["step"] + 1 if state else 0
        print(f"start step={start} slurm_restart={os.environ.get('SLURM_RESTART_COUNT', '0')} at={time.time():.3f}", flush=True)
        for batch in DataLoader(Slow(), batch_size=4, num_workers=2, multiprocessing_context="fork"):
            ckpt.maybe_save(step, lambda: {"step": step})
            if ckpt.stop_requested:
                ckpt.wait()
                print(f"saved step={step} at={time.time():.3f}", flush=True)
                sys.exit(0)
            step += 1
            if step == total:
                break
        ckpt.save({"step": total - 1}, total - 1)
        ckpt.wait()
        print(f"finished step={total - 1}", flush=True)
"""

# The shape of examples/slurm-train.sbatch, with a one-minute limit and a job of seconds.
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "slurm-train.sbatch"
SBATCH = """\
    #!/bin/bash
    #SBATCH --job-name=trainguard-test
    #SBATCH --time={time}
    #SBATCH --requeue
    #SBATCH --open-mode=append
    #SBATCH --output=slurm-%j.out
    {signal}
    exec {launcher}trainguard run --foreground --requeue --name "train-$SLURM_JOB_ID" --checkpoint-dir {ckpt} \\
        --grace 20s -- {python} train.py {args}
"""


def _submit(slurm: LocalSlurm, folder: Path, *, time_limit: str = "1", signal: str = "", args: str = "",
            srun: bool = True, options: tuple[str, ...] = (), train: str = TRAIN) -> str:  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.py").write_text(textwrap.dedent(train))
    script = folder / "job.sbatch"
    script.write_text(textwrap.dedent(SBATCH).format(time=time_limit, signal=signal, ckpt=folder / "ckpt",
                                                     launcher="srun " if srun else "", python=sys.executable,
                                                     args=args))  # fmt: skip
    return slurm.sbatch(script, *options, env=_job_env(slurm, folder))


def _job_env(slurm: LocalSlurm, folder: Path) -> dict[str, str]:
    env = slurm.env()
    env["TRAINGUARD_HOME"] = str(folder / "state")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(folder: Path, job_id: str) -> dict:
    """The trainguard run of the job (continued in place across requeues), as `status --json` says."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "trainguard", "status", f"train-{job_id}", "--json"],
                          env={**os.environ, "TRAINGUARD_HOME": str(folder / "state")}, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def _job_output(folder: Path) -> str:
    """What the job printed, attempt after attempt (trainguard's attempt logs), in order."""
    logs = sorted((folder / "state" / "runs").glob("*/attempt-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    return "".join(log.read_text(errors="replace") for log in logs)


def _slurm_output(folder: Path, job_id: str) -> str:
    path = folder / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _wait_until_ended(slurm: LocalSlurm, job_id: str, folder: Path, timeout: float) -> dict[str, str]:
    """The job's record once it has ended for good; on a timeout, everything there is to read."""
    try:
        return slurm.wait_for_job(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED"), timeout)
    except AssertionError as exc:
        queue = slurm.client("squeue", "-o", "%i %P %T %r %M %l").stdout
        raise AssertionError(f"{exc}\njob: {slurm.job(job_id)}\nqueue:\n{queue}\nslurm output:\n"
                             f"{_slurm_output(folder, job_id)}\njob output:\n{_job_output(folder)}") from None  # fmt: skip


def _assert_resumed_where_saved(output: str) -> list[float]:
    """Every start after the first resumes at the step after the previous save; the requeue-to-resume
    times (saved -> training again), in seconds."""
    events = re.findall(r"^(start|saved) step=(\d+)(?: slurm_restart=\d+)? at=([\d.]+)", output, re.M)
    gaps = []
    for (kind, step, at), (next_kind, next_step, next_at) in itertools.pairwise(events):
        if kind == "saved":
            assert next_kind == "start" and int(next_step) == int(step) + 1, events
            gaps.append(float(next_at) - float(at))
    return gaps


def test_a_job_killed_at_its_time_limit_saves_is_requeued_and_resumes_until_it_finishes(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    # 100 s of work in a one-minute job: Slurm's SIGTERM at the limit (enforced 60-90 s in) stops it.
    job_id = _submit(slurm, tmp_path, args="1000")
    final = _wait_until_ended(slurm, job_id, tmp_path, 420)
    output, slurm_output = _job_output(tmp_path), _slurm_output(tmp_path, job_id)
    assert final["JobState"] == "COMPLETED", (final, slurm_output, output)
    assert "DUE TO TIME LIMIT" in slurm_output
    assert "requeueing job" in slurm_output and "reached its time limit" in slurm_output
    assert "Exited with exit code 75" in slurm_output  # srun's word on trainguard's verdict
    assert int(final["Restarts"]) >= 1
    assert "finished step=999" in output
    gaps = _assert_resumed_where_saved(output)
    assert len(gaps) == int(final["Restarts"])
    run = _run(tmp_path, job_id)
    assert run["state"] == "succeeded"
    assert run["attempts"][0]["resumed_from"] is None and all(a["resumed_from"] for a in run["attempts"][1:])
    print(f"\ntime limit: requeue-to-resume (saved -> training again) {', '.join(f'{g:.1f}' for g in gaps)} s")


def test_the_pre_timeout_signal_is_a_save_request_and_the_job_is_requeued_at_the_saved_step(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    # USR1 to the batch shell, which is trainguard (exec), when less than 55 s are left of a one-minute
    # limit: 5-35 s into the job, long before the time limit. The example's shape: no srun, because
    # srun would pass the signal on to every process of its step (a DataLoader worker dies of it).
    job_id = _submit(slurm, tmp_path, signal="#SBATCH --signal=B:USR1@55", args="450", srun=False)
    final = _wait_until_ended(slurm, job_id, tmp_path, 420)
    output, slurm_output = _job_output(tmp_path), _slurm_output(tmp_path, job_id)
    assert final["JobState"] == "COMPLETED", (final, slurm_output, output)
    assert "DUE TO TIME LIMIT" not in slurm_output  # saved and requeued before the limit, every time
    assert "SIGUSR1: a save request, passed on to process" in output
    assert "helper_alive=True" in output and "helper_alive=False" not in output  # only the saver got it
    assert int(final["Restarts"]) >= 1 and "finished step=449" in output
    gaps = _assert_resumed_where_saved(output)
    assert len(gaps) == int(final["Restarts"])
    run = _run(tmp_path, job_id)
    assert run["state"] == "succeeded"
    interrupted = run["attempts"][:-1]
    assert interrupted and all(a["cause"] == "preempted" for a in interrupted)  # saved and left on USR1
    assert len(run["attempts"]) == len(gaps) + 1  # handed to Slurm at once: no local restart on the node
    print(f"\npre-timeout USR1: requeue-to-resume {', '.join(f'{g:.1f}' for g in gaps)} s")


def test_a_requeue_from_outside_saves_and_the_job_resumes(slurm: LocalSlurm, tmp_path: Path) -> None:
    job_id = _submit(slurm, tmp_path, time_limit="5", args="150")
    wait_for(lambda: "start step=0" in _job_output(tmp_path) and "step=" in _job_output(tmp_path),
             timeout=60, what="the job to train")  # fmt: skip
    time.sleep(3)  # a few saves in
    done = slurm.client("scontrol", "requeue", job_id)
    assert done.returncode == 0, done.stderr
    final = _wait_until_ended(slurm, job_id, tmp_path, 180)
    output, slurm_output = _job_output(tmp_path), _slurm_output(tmp_path, job_id)
    assert final["JobState"] == "COMPLETED" and final["Restarts"] == "1", (final, slurm_output, output)
    assert "DUE TO JOB REQUEUE" in slurm_output
    assert "has already been requeued by Slurm" in slurm_output  # trainguard did not ask a second time
    gaps = _assert_resumed_where_saved(output)
    assert len(gaps) == 1 and "finished step=149" in output
    print(f"\nscontrol requeue from outside: requeue-to-resume {gaps[0]:.1f} s")


@pytest.mark.parametrize("srun", [True, False], ids=["srun step", "batch step"])
def test_a_preempted_job_saves_is_requeued_and_resumes(slurm: LocalSlurm, tmp_path: Path, srun: bool) -> None:
    """A job in a higher priority partition takes the node (PreemptMode=CANCEL, GraceTime=10): Slurm
    would cancel the preempted job; trainguard saves it and requeues it instead. Slurm signals a job
    step at once and keeps the job RUNNING for its grace time; a batch step alone is signalled when
    the grace time is over, the job COMPLETING with a PreemptTime: both are requeued."""
    every_cpu = f"--cpus-per-task={slurm.cpus}"
    job_id = _submit(slurm, tmp_path, time_limit="10", args="450", srun=srun, options=(every_cpu,))
    wait_for(lambda: re.search(r"^start step=0", _job_output(tmp_path), re.M), timeout=60, what="the job to train")
    # A SIGTERM before the loop's first maybe_save takes its course (nothing could save it): preempt a
    # job that trains, a save in.
    wait_for(lambda: list((tmp_path / "ckpt").glob("step-*")), timeout=60, what="the first save")
    urgent = slurm.client("sbatch", "--parsable", "--partition=urgent", every_cpu, "--output=/dev/null",
                          "--wrap=sleep 2", cwd=str(tmp_path))  # fmt: skip
    assert urgent.returncode == 0, urgent.stderr
    final = _wait_until_ended(slurm, job_id, tmp_path, 240)
    output, slurm_output = _job_output(tmp_path), _slurm_output(tmp_path, job_id)
    assert final["JobState"] == "COMPLETED" and final["Restarts"] == "1", (final, slurm_output, output)
    assert slurm.job(urgent.stdout.strip())["JobState"] == "COMPLETED"  # the urgent job got the node
    if srun:
        assert "STEP" in slurm_output and "requeueing job" in slurm_output
    else:
        assert "DUE TO PREEMPTION" in slurm_output and "requeueing job" in slurm_output
        assert "it was preempted" in slurm_output
    gaps = _assert_resumed_where_saved(output)
    assert len(gaps) == 1 and "finished step=449" in output
    print(f"\npreemption ({'srun' if srun else 'batch'} step): requeue-to-resume {gaps[0]:.1f} s")


def test_a_bug_is_not_requeued_and_the_job_fails_with_78(slurm: LocalSlurm, tmp_path: Path) -> None:
    job_id = _submit(slurm, tmp_path, time_limit="5", args="100 bug")
    final = _wait_until_ended(slurm, job_id, tmp_path, 120)
    slurm_output = _slurm_output(tmp_path, job_id)
    assert final["JobState"] == "FAILED" and final["ExitCode"] == "78:0", (final, slurm_output)
    assert final["Restarts"] == "0"
    assert "not requeued: the run needs a fix first" in slurm_output
    run = _run(tmp_path, job_id)
    assert [a["cause"] for a in run["attempts"]] == ["python_error"]


def test_a_scancel_saves_and_is_not_undone_by_a_requeue(slurm: LocalSlurm, tmp_path: Path) -> None:
    job_id = _submit(slurm, tmp_path, time_limit="5", args="1000")
    wait_for(lambda: re.search(r"^start step=0", _job_output(tmp_path), re.M), timeout=60, what="the job to train")
    time.sleep(2)
    assert slurm.client("scancel", job_id).returncode == 0
    final = _wait_until_ended(slurm, job_id, tmp_path, 120)
    time.sleep(3)  # a requeue, had one been asked for, would show by now
    final = slurm.job(job_id)
    slurm_output = _slurm_output(tmp_path, job_id)
    assert final["JobState"] == "CANCELLED" and final["Restarts"] == "0", (final, slurm_output)
    assert "was cancelled before its time limit" in slurm_output
    assert "Exited with exit code 75" in slurm_output  # a stop from outside is still 75, just not requeued
    assert re.search(r"^saved step=\d+", _job_output(tmp_path), re.M)  # the job saved within the grace


def test_scancel_signal_term_of_an_srun_step_saves_a_dataloader_loop_and_resumes_there(
    slurm: LocalSlurm, tmp_path: Path
) -> None:
    """`scancel --signal=TERM` signals every process of the job's steps, DataLoader workers among them
    (issue 18: the workers died first, the loop died in `next(it)` with no checkpoint, and the requeued
    job started again at step 0). The workers are spared until the loop has saved; the job is
    requeued (a stop from outside that is not a cancel) and resumes at the step after its save."""
    pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
    job_id = _submit(slurm, tmp_path, time_limit="5", args="400", train=TRAIN_LOADER)
    wait_for(lambda: re.search(r"^start step=0", _job_output(tmp_path), re.M), timeout=60, what="the job to train")
    time.sleep(5)
    assert slurm.client("scancel", "--signal=TERM", job_id).returncode == 0
    final = _wait_until_ended(slurm, job_id, tmp_path, 240)
    output, slurm_output = _job_output(tmp_path), _slurm_output(tmp_path, job_id)
    assert "exited unexpectedly" not in output, output[-3000:]
    saved = re.search(r"^saved step=(\d+)", output, re.M)
    assert saved and int(saved.group(1)) >= 10, (output[-3000:], slurm_output)
    assert final["JobState"] == "COMPLETED" and final["Restarts"] == "1", (final, slurm_output, output[-3000:])
    _assert_resumed_where_saved(output)
    assert "finished step=399" in output
