"""Why did it die: gathers the evidence about a dead job (its logs, the kernel log, its exit status)
and asks the pure classifier, and, where it does not decide, what to look at next. The supervisor and
``trainguard diagnose`` both call this."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

from trainguard import causes
from trainguard._i18n import Text
from trainguard.diagnosis import launch as launch_facts
from trainguard.diagnosis import ranks
from trainguard.diagnosis.classify import Diagnosis, classify
from trainguard.diagnosis.evidence import (
    SILENT_END,
    ExitStatus,
    KernelLine,
    Observation,
    observations_from_exit,
    observations_from_kernel,
    observations_from_log,
    observations_of_a_silent_end,
    pids_in,
)
from trainguard.diagnosis.next_steps import Gathered, Step, default_steps, next_steps
from trainguard.diagnosis.oom_evidence import SENDER_UNKNOWN, OomDeltas, judge_oom_counts
from trainguard.diagnosis.scan import Scanner
from trainguard.diagnosis.signatures import Role, SignatureTable, default_table
from trainguard.paths import cache_dir


@dataclass(frozen=True)
class LogSource:
    name: str | None  # shown beside the evidence when several logs are judged together
    blocks: Iterable[bytes]
    rank: int | None = None  # the rank whose log this is (one rank's file of a launcher's job)


@dataclass(frozen=True)
class Report:
    diagnosis: Diagnosis
    lines_scanned: int
    bytes_scanned: int
    engine: str
    first_failure: dict[str, Any] | None = None  # {"rank", "host", "time", "file"} where the logs say
    gathered: Gathered = field(default_factory=Gathered)  # what the diagnosis had to go on
    next_steps: tuple[Step, ...] = ()  # what would decide it, when it is unknown or unsure


@cache
def default_scanner() -> Scanner:
    return Scanner(default_table().signatures, cache_dir=cache_dir())


def investigate(
    logs: Sequence[LogSource],
    *,
    exit_status: ExitStatus | None = None,
    kernel_lines: Sequence[KernelLine] = (),
    job_pids: Iterable[int] | None = None,
    extra: Sequence[Observation] = (),
    scanner: Scanner | None = None,
    table: SignatureTable | None = None,
    kernel_readable: bool = False,
    launch: launch_facts.LaunchFacts | None = None,
    logs_are_all: bool = False,
    oom_deltas: OomDeltas | None = None,
) -> Report:
    """``kernel_readable``: the kernel log of the time of death was read (it is in
    ``kernel_lines``, whatever it holds). A SIGKILL with no OOM kill of the job in a readable kernel
    log was sent by someone: ``killed``, not ``host_oom``.

    ``launch``: the job ran under a launcher (torchrun, DeepSpeed, Accelerate), so its ranks are
    judged one by one and the cause is that of the rank that failed first (see ``judge_ranks``).

    ``oom_deltas``: the OOM kills the machine and the job's memory cgroup counted during the attempt
    (read by the supervisor at its start and its death): they decide a SIGKILL where the kernel log
    cannot be read, and where nothing decides it both readings stand, with how to tell them apart.

    ``logs_are_all``: nobody saw the job end (a log file handed to ``diagnose``; it may even still
    run): a log that reports no failure at all is read as such (stuck, or stopped without a word)."""
    scanner = scanner or default_scanner()
    table = table or default_table()
    observations: list[Observation] = list(extra)
    mentioned: set[int] = set()
    lines = size = 0
    for index, log in enumerate(logs):
        result = scanner.scan(log.blocks)
        lines += result.lines
        size += result.bytes
        found = observations_from_log(result.matches, file=log.name, file_index=index)
        observations += attribute_ranks(found, log.rank, launch) if launch is not None else found
        mentioned |= pids_in(result.matches)
    observations += observations_from_exit(exit_status, table.exit_rules)
    observations += observations_from_kernel(
        kernel_lines,
        table.signatures,
        job_pids=set(job_pids) if job_pids is not None else None,
        mentioned_pids=mentioned,
    )
    counted = judge_oom_counts(oom_deltas) if oom_deltas is not None else None
    if counted is not None:
        observations += counted.observations
    if kernel_readable:
        observations = sigkill_without_oom_is_killed(observations)
    elif counted is not None and counted.decided:
        observations = sigkill_without_oom_is_killed(observations, counted.reason)
    elif counted is not None and any(o.sigkill for o in observations):
        observations = [replace(o, note=o.note or SENDER_UNKNOWN.note) if o.sigkill else o for o in observations]
        observations.append(SENDER_UNKNOWN)
    if logs_are_all and exit_status is None:
        observations += observations_of_a_silent_end(observations, table.silent_end)
    names = [log.name for log in logs]
    if launch is not None:
        diagnosis, first = judge_ranks(observations, launch, names)
    else:
        diagnosis = classify(observations)
        first = first_failure(diagnosis.cause, observations, names)
    gathered = Gathered(
        exit_status=exit_status is not None,
        kernel_log=kernel_readable or bool(kernel_lines),
        oom_counters=oom_deltas is not None and (oom_deltas.system is not None or oom_deltas.cgroup is not None),
        logs=len(logs),
        ranks=_ranks_named(observations),
        silent=not any(_reports_a_failure(o) for o in observations),
    )
    steps = next_steps(diagnosis, gathered, default_steps())
    return Report(diagnosis, lines, size, scanner.engine, first, gathered, steps)


def _ranks_named(observations: Sequence[Observation]) -> frozenset[int]:
    """The ranks the log lines read name (the rank of their log, or a prefix or field of the line)."""
    named = (o.rank if o.rank is not None else ranks.line_rank(o.text) for o in observations if o.source == "log")
    return frozenset(rank for rank in named if rank is not None)


def _reports_a_failure(obs: Observation) -> bool:
    return obs.source == "log" and obs.weight > 0 and obs.role is not Role.SUPPORT and obs.rule != SILENT_END


def attribute_ranks(
    observations: Sequence[Observation], rank: int | None, launch: launch_facts.LaunchFacts
) -> list[Observation]:
    """Each observation of one log with the rank that printed it: the log's own rank (one rank's
    file), else the line's prefix. Lines of torchrun's failure summary are a wrapper: those of the
    first failure are that rank's evidence (its exit status), those of the ranks the agent tore down
    afterwards (SIGTERM) are dropped."""
    summary = launch_facts.summary_lines(launch.failures)
    kept = []
    for obs in observations:
        if rank is not None:
            kept.append(replace(obs, rank=rank))
            continue
        failure = summary.get(obs.text.strip())
        if failure is not None:
            if failure.first:
                kept.append(replace(obs, rank=failure.rank))
            continue
        kept.append(replace(obs, rank=launch_facts.line_rank(obs.text, launch)))
    return kept


NOT_THE_ROOT = ("peer_failure", causes.UNKNOWN)


def judge_ranks(
    observations: Sequence[Observation], launch: launch_facts.LaunchFacts, names: Sequence[str | None]
) -> tuple[Diagnosis, dict[str, Any] | None]:
    """The diagnosis of a launcher's job: each rank is judged on its own lines; the rank that failed
    first is one whose own cause is not a lost peer (the others' "Connection closed by peer", NCCL
    timeouts and the agent's SIGTERM are its echoes): the one the supervisor found hung, else
    torchrun's first observed failure, else the earliest by the lines' timestamps. The job's cause
    is judged on that rank's lines and the job-wide evidence (exit status, kernel, cgroup, hang).
    When every rank only lost a peer, the cause is ``peer_failure``: the first failure is on another
    node, and no rank here is named."""
    by_rank: dict[int, list[Observation]] = defaultdict(list)
    for obs in observations:
        if obs.rank is not None:
            by_rank[obs.rank].append(obs)
    lost_a_peer = {rank for rank, found in by_rank.items() if _only_lost_a_peer(found)}
    own_cause = {rank: classify(found).cause for rank, found in by_rank.items()}
    candidates = {rank for rank, cause in own_cause.items() if cause not in NOT_THE_ROOT and rank not in lost_a_peer}
    first = launch.first_failure
    root: int | None
    if launch.hung_ranks:
        root = launch.hung_ranks[0]
    elif first is not None and first.rank in candidates:
        root = first.rank
    elif candidates:
        root = min(candidates, key=lambda rank: _earliest(by_rank[rank]))
    else:
        root = first.rank if first is not None else None
    if not candidates and lost_a_peer and not launch.hung_ranks:
        # Every rank here only lost a peer: the exceptions they raised wrap the lost connection, and
        # the cause is on another node.
        chosen = [_as_root(o) if o.cause == "peer_failure" else o for o in observations
                  if o.rank not in lost_a_peer or o.cause == "peer_failure" or o.role is Role.ROOT]  # fmt: skip
        return classify(chosen), None
    chosen = [o for o in observations if o.rank is None or o.rank == root] if root is not None else list(observations)
    diagnosis = classify(chosen)
    if root is None or diagnosis.cause == "peer_failure":
        return diagnosis, None
    own = sorted((o for o in by_rank.get(root, []) if o.cause == diagnosis.cause), key=_earliest_key)
    stamp = next((s for o in own if (s := ranks.line_time(o.text))), None)
    found: dict[str, Any] = {"rank": root, "host": None, "time": stamp.text if stamp else None}
    if first is not None and first.rank == root:  # torchrun's own record of when and where it failed
        found.update(local_rank=first.local_rank, host=first.host, time=first.time or found["time"])
    found["host"] = found["host"] or next((h for o in own if (h := ranks.line_host(o.text))), None) or launch.host
    file_index = own[0].order[0] if own else -1
    if 0 <= file_index < len(names) and names[file_index]:
        found["file"] = names[file_index]
    return diagnosis, found


def _only_lost_a_peer(observations: Sequence[Observation]) -> bool:
    """A rank whose lines say it lost a peer and name no root cause of its own (its exceptions and
    tracebacks wrap the lost connection)."""
    lost = any(o.cause == "peer_failure" and o.weight > 0 for o in observations)
    own_root = any(o.role is Role.ROOT and o.cause != "peer_failure" and o.weight >= 0.5 for o in observations)
    return lost and not own_root


def _as_root(obs: Observation) -> Observation:
    return replace(obs, role=Role.ROOT) if obs.role is Role.CASCADE else obs


def _earliest_key(obs: Observation) -> tuple[float, tuple[int, int]]:
    stamp = ranks.line_time(obs.text)
    return (stamp.key if stamp else float("inf"), obs.order)


def _earliest(observations: Sequence[Observation]) -> tuple[float, tuple[int, int]]:
    return min((_earliest_key(o) for o in observations), default=(float("inf"), (1 << 30, 0)))


def sigkill_without_oom_is_killed(observations: list[Observation], reason: Text | None = None) -> list[Observation]:
    """Read every SIGKILL as ``killed`` when the kernel (or the job's cgroup) recorded no OOM kill
    that could be the job's: the OOM killer always leaves a record, so someone else sent it.
    ``reason``: where that record was looked for, when not in a readable kernel log."""
    oom_recorded = any(
        o.cause == "host_oom" and o.source in ("kernel", "telemetry") and o.weight > 0 and o.role is not Role.SUPPORT
        for o in observations
    )
    if oom_recorded:
        return observations
    note = reason or Text("a readable kernel log holds no OOM kill of the job: the SIGKILL came from outside",
                          "内核日志可读，且没有作业被 OOM 杀死的记录：SIGKILL 来自外部")
    return [replace(o, cause="killed", note=o.note or note) if o.sigkill else o for o in observations]


def first_failure(
    cause: str, observations: Sequence[Observation], names: Sequence[str | None]
) -> dict[str, Any] | None:
    """Where the diagnosed cause struck first: the rank (and host) whose line of that cause carries the
    earliest timestamp, across every rank's log (or the ranks' prefixes inside one log)."""
    candidates = []
    for obs in observations:
        if obs.cause != cause or obs.source != "log" or obs.line is None or obs.role is Role.WRAPPER:
            continue
        file_index = obs.order[0]
        name = names[file_index] if 0 <= file_index < len(names) else None
        rank = ranks.line_rank(obs.text)
        if rank is None:
            rank = ranks.name_rank(name)
        stamp = ranks.line_time(obs.text)
        candidates.append((stamp.key if stamp else float("inf"), obs.order, obs, rank, stamp, name))
    if not candidates:
        return None
    _key, _order, obs, rank, stamp, name = min(candidates, key=lambda c: (c[0], c[1]))
    host = ranks.line_host(obs.text)
    if rank is None and host is None and (stamp is None or len(names) < 2):
        return None  # one log and nothing to tell ranks apart: there is no "first" to name
    found: dict[str, Any] = {"rank": rank, "host": host, "time": stamp.text if stamp else None}
    if name:
        found["file"] = name
    return found


def _evidence_json(obs: Observation, lang: str) -> dict[str, Any]:
    item: dict[str, Any] = {"source": obs.source, "line": obs.line, "text": obs.text}
    if obs.file is not None:
        item["file"] = obs.file
    if obs.note is not None:
        item["note"] = obs.note.pick(lang)
    return item


def diagnosis_dict(
    diagnosis: Diagnosis, lang: str, first: dict[str, Any] | None = None, steps: Sequence[Step] = ()
) -> dict[str, Any]:
    """The diagnose JSON of DESIGN section 5; ``first_failure`` where the logs say where it struck
    first, ``next_steps`` where the answer is unknown or unsure and something would decide it."""
    cause = causes.get(diagnosis.cause)
    found = {
        "cause": diagnosis.cause,
        "confidence": diagnosis.confidence,
        "title": cause.title_in(lang),
        "evidence": [_evidence_json(o, lang) for o in diagnosis.evidence],
        "fixes": list(cause.fixes_in(lang)),
        "alternatives": [{"cause": c, "confidence": conf} for c, conf in diagnosis.alternatives],
    }
    if first is not None:
        found["first_failure"] = first
    if steps:
        found["next_steps"] = [step.text.pick(lang) for step in steps]
    return found


def report_dict(report: Report, lang: str) -> dict[str, Any]:
    return diagnosis_dict(report.diagnosis, lang, report.first_failure, report.next_steps)
