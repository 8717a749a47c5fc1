"""Slurm: ``trainguard run --foreground --requeue`` hands a run that another attempt, node or time may
cure (verdict 75) back to Slurm with ``scontrol requeue $SLURM_JOB_ID``; Slurm runs the batch script
again (SLURM_RESTART_COUNT=1, 2, ...) and the job resumes from its newest checkpoint.

Whether to ask is a pure function of the verdict and of what ``scontrol show job`` says of the job
when the run ends (``requeue_decision``); ``hand_back`` is the adapter that reads and asks. Slurm shows
a job that is being killed as COMPLETING whatever the reason: one killed at its time limit says
Reason=TimeLimit and has run its whole limit, a preempted one has a PreemptTime; one killed otherwise
was cancelled (``scancel``), and a person's cancel is never undone by a requeue. A job Slurm requeued itself
(``scontrol requeue`` from outside, ``PreemptMode=REQUEUE``) already counts one more restart than
this run of the script was given: it is not asked for twice.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from trainguard._i18n import Text
from trainguard.causes import VERDICT_EXIT

SCONTROL_TIMEOUT_S = 30.0
REQUEUE_VERDICT = VERDICT_EXIT["tempfail"]
_FIELD = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class SlurmJob:
    """What ``scontrol show job -o`` says of a job, as far as a requeue needs it."""

    job_id: str
    state: str  # RUNNING, COMPLETING, PENDING, TIMEOUT, CANCELLED, ...
    reason: str  # TimeLimit for a job killed at its limit (while COMPLETING too), None, ...
    restarts: int
    run_time_s: float | None
    time_limit_s: float | None  # None: UNLIMITED (or unreadable)
    preempted: bool = False  # PreemptTime is set: Slurm is taking the job's resources for another job
    batch: bool = True


@dataclass(frozen=True)
class RequeueDecision:
    ask: bool
    why: Text


def _decision(ask: bool, en: str, zh: str) -> RequeueDecision:
    return RequeueDecision(ask, Text(en, zh))


def job_id(environ: Mapping[str, str]) -> str | None:
    """The Slurm job this process runs in, or None outside Slurm."""
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times Slurm had requeued the job when this run of the batch script started."""
    try:
        return int(environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def parse_duration(text: str) -> float | None:
    """Slurm's ``[days-]hours:minutes:seconds`` (also ``minutes:seconds``); None for UNLIMITED."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def parse_job(record: str) -> SlurmJob | None:
    """A ``scontrol show job -o`` answer (``Key=value`` fields, one line per job: a heterogeneous job's
    first component stands for it); None when it is not one."""
    lines = record.strip().splitlines()
    fields = dict(_FIELD.findall(lines[0])) if lines else {}
    if "JobId" not in fields or "JobState" not in fields:
        return None
    try:
        restarts = int(fields.get("Restarts", "0"))
    except ValueError:
        restarts = 0
    return SlurmJob(
        job_id=fields["JobId"],
        state=fields["JobState"],
        reason=fields.get("Reason", ""),
        restarts=restarts,
        run_time_s=parse_duration(fields.get("RunTime", "")),
        time_limit_s=parse_duration(fields.get("TimeLimit", "")),
        preempted=fields.get("PreemptTime", "None") not in ("None", "Unknown", ""),
        batch=fields.get("BatchFlag", "1") != "0",
    )


def requeue_decision(verdict: int, job: SlurmJob | None, own_restarts: int) -> RequeueDecision:
    """Whether to ask Slurm to requeue the job, and why (or why not)."""
    if verdict != REQUEUE_VERDICT:
        why = {0: ("the run succeeded", "运行已成功"), VERDICT_EXIT["config"]: (
            "the run needs a fix first (exit 78): a requeue would fail the same way",
            "运行需要先修复（退出码 78）：重新排队只会以同样方式失败")}  # fmt: skip
        en, zh = why.get(verdict, (f"the verdict is {verdict}, not 75", f"结论为 {verdict}，不是 75"))
        return _decision(False, f"not requeued: {en}", f"未重新排队：{zh}")
    if job is None:  # scontrol could not say: ask anyway, Slurm refuses what it cannot do
        return _decision(True, "requeueing (the job's state could not be read)", "重新排队（无法读取作业状态）")
    if not job.batch:
        return _decision(False, f"not requeued: job {job.job_id} is not a batch job (srun/salloc)",
                               f"未重新排队：作业 {job.job_id} 不是批处理作业（srun/salloc）")  # fmt: skip
    if job.restarts > own_restarts or job.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        return _decision(False, f"job {job.job_id} has already been requeued by Slurm",
                               f"作业 {job.job_id} 已由 Slurm 重新排队")  # fmt: skip
    if job.state == "RUNNING":  # a pre-timeout save, a preemption's grace time, a failure retries cannot cure
        return _decision(True, f"requeueing job {job.job_id}", f"重新排队作业 {job.job_id}")
    if job.preempted or job.state == "PREEMPTED":
        return _decision(True, f"requeueing job {job.job_id}: it was preempted",
                               f"重新排队作业 {job.job_id}：已被抢占")  # fmt: skip
    if job.state == "TIMEOUT" or job.reason == "TimeLimit" or _at_time_limit(job):
        return _decision(True, f"requeueing job {job.job_id}: it reached its time limit",
                               f"重新排队作业 {job.job_id}：已到时间上限")  # fmt: skip
    if job.state in ("COMPLETING", "CANCELLED"):
        return _decision(
            False,
            f"not requeued: job {job.job_id} was cancelled before its time limit (scancel); a cancel is not undone",
            f"未重新排队：作业 {job.job_id} 在时间上限之前被取消（scancel）；取消不会被撤销",
        )
    return _decision(True, f"requeueing job {job.job_id} ({job.state})",
                           f"重新排队作业 {job.job_id}（{job.state}）")  # fmt: skip


def _at_time_limit(job: SlurmJob) -> bool:
    return job.time_limit_s is not None and job.run_time_s is not None and job.run_time_s >= job.time_limit_s


# ---------------------------------------------------------------------------------------------- adapter
def read_job(slurm_job_id: str) -> SlurmJob | None:
    """The job as ``scontrol show job -o`` says now; None where scontrol is missing or cannot say."""
    done = _scontrol(["show", "job", "-o", slurm_job_id])
    return parse_job(done.stdout) if done is not None and done.returncode == 0 else None


def request_requeue(slurm_job_id: str) -> tuple[bool, str]:
    """``scontrol requeue JOB``: whether Slurm took it, and what scontrol said."""
    done = _scontrol(["requeue", slurm_job_id])
    if done is None:
        return False, "scontrol is not on PATH or did not answer"
    said = (done.stderr or done.stdout).strip().splitlines()
    return done.returncode == 0, said[-1] if said else f"exit {done.returncode}"


def hand_back(verdict: int, environ: Mapping[str, str]) -> tuple[bool, Text] | None:
    """After a foreground run under ``--requeue``: ask Slurm to requeue when the verdict calls for it.
    Returns whether it was requeued and what to say, or None outside Slurm."""
    slurm_job_id = job_id(environ)
    if slurm_job_id is None:
        return None
    job = read_job(slurm_job_id) if verdict == REQUEUE_VERDICT else None
    decision = requeue_decision(verdict, job, restart_count(environ))
    if not decision.ask:
        return False, decision.why
    took, said = request_requeue(slurm_job_id)
    if took:
        return True, decision.why
    failed = f"scontrol requeue {slurm_job_id}"
    return False, Text(f"{failed} failed: {said}", f"{failed} 失败：{said}")


def _scontrol(args: list[str]) -> subprocess.CompletedProcess | None:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        return subprocess.run([scontrol, *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S,
                              check=False, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
