"""What a launcher (torchrun, DeepSpeed, Accelerate) says about its ranks, read as data: the failure
summary torchrun prints when a worker dies (``ChildFailedError``: each failed rank's exit code, time,
host, error file, and which one failed first), which rank printed a line, and which rank a hang is
waiting for (from the workers' stack dumps). Pure functions of text.

torchrun's summary is a wrapper, not evidence of its own: the ranks it lists besides the first one
died of the agent's SIGTERM (the teardown after the first failure), so their lines are echoes; the
first failure's exit status is that rank's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainguard.diagnosis import ranks

# torch/distributed/elastic/multiprocessing/errors/__init__.py, _FAILURE_FORMAT_TEMPLATE
_ENTRY = re.compile(r"^\[(?P<idx>[0-9]+)\]:\s*$")
_FIELD = re.compile(r"^  (?P<key>time|host|rank|exitcode|error_file|traceback) *: ?(?P<value>.*)$")
_RANK_VALUE = re.compile(r"^(?P<rank>-?[0-9]+) \(local_rank: (?P<local>-?[0-9]+)\)")
_EXIT_VALUE = re.compile(r"^(?P<code>-?[0-9]+) \(pid: (?P<pid>[0-9]+)\)")
_RULE = re.compile(r"^[-=]{8,}\s*$")
_ROOT_TITLE = "Root Cause (first observed failure):"
_FAILURES_TITLE = "Failures:"

# A worker's line as torchrun tees it to the console: "[<role><local rank>]:" before the text.
_TEED = re.compile(r"^\[(?P<role>[A-Za-z_][A-Za-z0-9_.-]*?)(?P<local>[0-9]+)\]:")
_GLOBAL = re.compile(r"\[rank(?P<rank>[0-9]+)\]:")
_LOCAL_FIELD = re.compile(r"\blocal_rank[ =:]+(?P<local>[0-9]+)")
# py-spy frames of a rank that waits for the others: a collective, a barrier, the store, the rendezvous.
_WAITING_FRAME = re.compile(
    r"(distributed_c10d\.py|c10d_logger\.py|torch/distributed/|\b(all_reduce|all_gather|broadcast|barrier|"
    r"reduce_scatter|all_to_all|_wait|wait)\b.*\(torch|deepspeed/comm/|nccl)"
)


@dataclass(frozen=True)
class WorkerFailure:
    """One entry of torchrun's failure summary."""

    rank: int | None  # global rank
    local_rank: int | None
    exitcode: int | None  # negative: killed by that signal
    pid: int | None
    time: str | None
    host: str | None
    error_file: str | None  # None when torchrun had none (<N/A>)
    first: bool  # the "Root Cause (first observed failure)" entry
    lines: tuple[str, ...]  # the entry's lines, as printed

    @property
    def signal(self) -> int | None:
        return -self.exitcode if self.exitcode is not None and self.exitcode < 0 else None


@dataclass(frozen=True)
class LaunchFacts:
    """What the supervisor learnt about the ranks of one attempt besides their logs."""

    failures: tuple[WorkerFailure, ...] = ()  # torchrun's summary, when it printed one
    global_ranks: Mapping[int, int] | None = None  # local rank -> global rank of this node's workers
    hung_ranks: tuple[int, ...] = ()  # ranks not waiting in a collective when the job was found hung
    host: str | None = None  # this node

    @property
    def first_failure(self) -> WorkerFailure | None:
        return next((f for f in self.failures if f.first), None)

    def global_rank(self, local_rank: int) -> int | None:
        return (self.global_ranks or {}).get(local_rank)


def parse_torchrun_summary(text: str) -> tuple[WorkerFailure, ...]:
    """The failures of the last ``ChildFailedError`` summary in ``text`` (empty when there is none)."""
    start = text.rfind(_FAILURES_TITLE)
    if start < 0 or _ROOT_TITLE not in text[start:]:
        return ()
    entries: list[tuple[bool, list[str]]] = []
    in_root = False
    for line in text[start:].splitlines():
        if line.strip() == _ROOT_TITLE:
            in_root = True
        elif _RULE.match(line):
            if in_root:
                break
        elif _ENTRY.match(line):
            entries.append((in_root, [line]))
        elif entries:
            entries[-1][1].append(line)
    return tuple(_failure(first, lines) for first, lines in entries)


def _failure(first: bool, lines: list[str]) -> WorkerFailure:
    fields: dict[str, str] = {}
    kept = lines[:1]
    last_key = None
    for line in lines[1:]:
        if field := _FIELD.match(line):
            last_key = field.group("key")
            fields[last_key] = field.group("value").strip()
            kept.append(line)
        elif last_key == "traceback" and line.startswith(" "):  # a traceback read from an error file
            fields["traceback"] += "\n" + line.strip()
            kept.append(line)
    rank = local = code = pid = None
    if found := _RANK_VALUE.match(fields.get("rank", "")):
        rank, local = int(found.group("rank")), int(found.group("local"))
    if found := _EXIT_VALUE.match(fields.get("exitcode", "")):
        code, pid = int(found.group("code")), int(found.group("pid"))
    error_file = fields.get("error_file")
    return WorkerFailure(
        rank=rank,
        local_rank=local,
        exitcode=code,
        pid=pid,
        time=fields.get("time"),
        host=fields.get("host"),
        error_file=None if error_file in (None, "", "<N/A>") else error_file,
        first=first,
        lines=tuple(kept),
    )


def line_rank(text: str, facts: LaunchFacts | None = None) -> int | None:
    """The global rank that printed a line: torch's own ``[rankN]:`` prefix; else torchrun's teed
    ``[<role><local rank>]:`` prefix through this node's local-to-global map (the local rank itself
    when no map is known); else whatever rank the line names."""
    if found := _GLOBAL.search(text):
        return int(found.group("rank"))
    if found := _TEED.match(text) or _LOCAL_FIELD.search(text):
        local = int(found.group("local"))
        mapped = facts.global_rank(local) if facts else None
        return mapped if mapped is not None else local
    return ranks.line_rank(text)


def waiting_in_collective(stack: str) -> bool:
    """Whether a worker's Python stack (py-spy dump) is inside torch.distributed: waiting for the others."""
    return bool(_WAITING_FRAME.search(stack))


def hung_ranks(stacks: Mapping[int, str]) -> tuple[int, ...]:
    """The ranks a hung job waits for: those whose stack is NOT in a collective while others' are.
    When every rank waits (or none does) no rank stands out: empty."""
    waiting = {rank for rank, stack in stacks.items() if waiting_in_collective(stack)}
    culprits = tuple(sorted(set(stacks) - waiting))
    return culprits if waiting and culprits else ()


def summary_lines(failures: Sequence[WorkerFailure]) -> dict[str, WorkerFailure]:
    """Each printed line of the summary (stripped) and the failure it belongs to."""
    return {line.strip(): failure for failure in failures for line in failure.lines if line.strip()}
