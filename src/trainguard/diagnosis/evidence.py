"""Evidence as plain values, and the pure functions that turn raw findings into observations.

An :class:`Observation` is one fact that speaks for a cause with a weight: a log line a signature
matched, a kernel-log record, the exit status. The classifier only ever sees observations.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainguard._i18n import Text
from trainguard.diagnosis.scan import LineMatch, clean_text
from trainguard.diagnosis.signatures import XID_CAUSE, ExitRule, Role, Signature, SilentEnd, lookup_xid


@dataclass(frozen=True)
class Observation:
    source: str  # "log" | "kernel" | "exit" | "telemetry" (DESIGN section 5)
    cause: str
    weight: float
    role: Role
    rule: str  # the signature id or exit rule that produced it
    text: str
    line: int | None = None
    file: str | None = None
    note: Text | None = None  # what the line means, when the line alone does not say (Xid codes)
    order: tuple[int, int] = (0, 0)  # (file index, line): earlier is closer to the root cause
    sigkill: bool = False  # says that a process died of SIGKILL (whoever sent it)
    witness: str | None = None  # the event it reports with other rules (signatures.Signature.witness)
    rank: int | None = None  # the rank of a job of several that printed it, where known


# ----------------------------------------------------------------------------- exit status
_MAX_SIGNAL = 64


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: an exit code, or the signal that killed it."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_number(cls, value: int) -> ExitStatus:
        """Read an exit status as people and tools print it: -N (Python's subprocess) and 128+N
        (shells, Docker, Kubernetes) are death by signal N; 0..128 are exit codes."""
        if _is_ntstatus(value):  # Windows: 0xC0000005 (access violation) and friends, printed either way
            return cls(code=value & 0xFFFFFFFF)
        if value < 0:
            if -value > _MAX_SIGNAL:
                raise ValueError(f"{value} is not a signal number")
            return cls(signal=-value)
        if 128 < value <= 128 + _MAX_SIGNAL:
            return cls(signal=value - 128)
        if value > 255:
            raise ValueError(f"{value} is not an exit status (0..255)")
        return cls(code=value)

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return _signal.Signals(self.signal).name
        except ValueError:
            return f"SIG{self.signal}"

    def describe(self) -> str:
        if self.code is not None and self.code > 255:
            return f"exit code {self.code:#010x}"
        if self.signal is not None:
            return f"killed by signal {self.signal} ({self.signal_name}), exit status {128 + self.signal}"
        return f"exit code {self.code}"

    def describe_zh(self) -> str:
        if self.code is not None and self.code > 255:
            return f"退出码 {self.code:#010x}"
        if self.signal is not None:
            return f"被信号 {self.signal}（{self.signal_name}）终止，退出状态 {128 + self.signal}"
        return f"退出码 {self.code}"


def _is_ntstatus(value: int) -> bool:
    """A Windows NTSTATUS error (0xC0000000 to 0xCFFFFFFF), as an unsigned or a signed 32-bit number."""
    return 0xC0000000 <= value < 0xD0000000 or -(1 << 30) <= value < -(1 << 30) + (1 << 28)


def observations_from_exit(status: ExitStatus | None, rules: Sequence[ExitRule]) -> list[Observation]:
    if status is None:
        return []
    found = []
    for rule in rules:
        if (rule.signal is not None and rule.signal == status.signal_name) or (
            rule.code is not None and rule.code == status.code
        ):
            found.append(
                Observation(
                    source="exit",
                    cause=rule.cause,
                    weight=rule.weight,
                    role=rule.role,
                    rule=f"exit:{rule.signal or rule.code}",
                    text=status.describe(),
                    note=Text(status.describe(), status.describe_zh()),
                    order=(1 << 30, 0),
                    sigkill=rule.sigkill,
                    witness=rule.witness,
                )
            )
    return found


# ----------------------------------------------------------------------------- log lines
def _cause_and_weight(signature: Signature, groups: dict[str, str]) -> tuple[str, float, str | None]:
    if signature.cause != XID_CAUSE:
        return signature.cause, signature.weight, None
    # An Xid 45 that says what caused it is that Xid's consequence: read it as the Xid it names.
    info = lookup_xid(int(groups.get("previous") or groups["xid"]))
    en, zh = f"Xid {info.xid}: {info.name}", f"Xid {info.xid}：「{info.name}」"
    if info.action:  # NVIDIA's catalogue is in English: quoted as it says it
        en, zh = f"{en} — {info.action}", f"{zh}；NVIDIA 的建议：「{info.action}」"
    return info.cause, info.weight, Text(en, zh)


def observations_from_log(
    matches: Iterable[LineMatch], *, file: str | None = None, file_index: int = 0
) -> list[Observation]:
    matches = list(matches)
    contexts = [m for m in matches if m.signature.rereads]
    narrowed = {(m.line, other) for m in matches for other in m.signature.narrows}
    found = []
    for match in matches:
        if (match.line, match.signature.id) in narrowed:
            continue  # a more specific row reads this line
        signature = match.signature
        if signature.rereads:
            continue  # a context row names nothing by itself
        cause, weight, note = _cause_and_weight(signature, match.groups)
        context = _context_for(match, contexts)
        if context is not None:
            cause = context.signature.cause
            where = context.text[:120]
            note = Text(f"read as {cause}: line {context.line} shows where it happened ({where})",
                        f"按第 {context.line} 行所示的位置判为 {cause}（「{where}」）")  # fmt: skip
        readings = [(cause, weight), *([] if context else signature.also)]
        for reading_cause, reading_weight in readings:
            found.append(
                Observation(
                    source="log",
                    cause=reading_cause,
                    weight=reading_weight,
                    role=signature.role,
                    rule=signature.id,
                    text=match.text,
                    line=match.line,
                    file=file,
                    note=note,
                    order=(file_index, match.line),
                    sigkill=signature.sigkill,
                    witness=signature.witness,
                )
            )
    return found


SILENT_END = "silent_end"  # the rule of the observations that read a log's silence


def observations_of_a_silent_end(
    observations: Iterable[Observation], silent_end: SilentEnd | None
) -> list[Observation]:
    """A log in which no line reports a failure, when the log is all there is (no exit status): the
    silence is itself evidence, weak and several ways (a stuck job, or one stopped by something
    that writes nothing into its log). Telemetry-like support lines do not break the silence."""
    if silent_end is None or any(o.weight > 0 and o.role is not Role.SUPPORT for o in observations):
        return []
    said = Text(f"{silent_end.text.en}. {silent_end.note.en}", f"{silent_end.text.zh}。{silent_end.note.zh}")
    return [
        Observation(
            source="log",
            cause=cause,
            weight=weight,
            role=Role.ROOT,
            rule=SILENT_END,
            text=silent_end.text.en,
            note=said,
            order=(1 << 29, 0),
        )
        for cause, weight in silent_end.readings
    ]


def _within(match: LineMatch, context: LineMatch) -> bool:
    return abs(match.line - context.line) <= context.signature.window


def _context_for(match: LineMatch, contexts: Sequence[LineMatch]) -> LineMatch | None:
    """The nearest context line that re-reads this match (ENOSPC under SemLock is /dev/shm)."""
    near = [c for c in contexts if match.signature.id in c.signature.rereads and _within(match, c)]
    return min(near, key=lambda c: abs(match.line - c.line), default=None)


def pids_in(matches: Iterable[LineMatch]) -> set[int]:
    """Process ids the log itself names as dead (a DataLoader worker, a shell's 'Killed' line)."""
    return {int(m.groups["pid"]) for m in matches if m.groups.get("pid", "").isdigit()}


# ----------------------------------------------------------------------------- kernel log
@dataclass(frozen=True)
class KernelLine:
    text: str
    time: float | None = None  # seconds since the epoch, when the format says


# A kernel record names a process: certain when that process is the job's, nothing when it is another.
LINKED_WEIGHT = 0.99
UNLINKED_FACTOR = 0.9  # the job's pids are not known (a saved log with no run record)
# Records that cannot be tied to the job (a saved log with no run record, a machine with other
# users) are one witness together, never more than this, and echoes beside a clear root in the
# job's own log: an OOM kill of someone else's process must not outweigh the job's CUDA OOM.
UNLINKED_CAP = 0.5
# A record about another process says nothing about the job: several of them (one OOM kill prints
# three lines) must not add up to a cause.
OTHER_PROCESS_FACTOR = 0.0


def observations_from_kernel(
    lines: Iterable[KernelLine],
    signatures: Sequence[Signature],
    *,
    job_pids: set[int] | None = None,
    mentioned_pids: set[int] | None = None,
) -> list[Observation]:
    """``job_pids``: every process of the job, when a run record knows them (a record naming any
    other process is about someone else). ``mentioned_pids``: processes the job's own log names as
    killed; they link a record to the job but say nothing about the others."""
    linked = (job_pids or set()) | (mentioned_pids or set())
    kernel_signatures = [s for s in signatures if s.kernel]
    found = []
    for number, line in enumerate(lines, start=1):
        raw = line.text.encode("utf-8", "replace")
        for signature in kernel_signatures:
            match = signature.regex.search(raw)
            if match is None:
                continue
            groups = {k: v.decode("utf-8", "replace") for k, v in match.groupdict().items() if v is not None}
            cause, weight, note = _cause_and_weight(signature, groups)
            pid = groups.get("pid")
            role, rule = signature.role, signature.id
            linked_to_job = pid is not None and int(pid) in linked
            if linked_to_job:
                weight = max(weight, LINKED_WEIGHT)
                note = Text(f"names the job's process {pid}", f"记录中的进程 {pid} 是作业的进程")
            elif job_pids and (pid is not None or cause == "host_oom"):
                # About another process, or an OOM line that names no process (a cgroup summary,
                # "invoked oom-killer"): the record that names the job's process would speak for it.
                weight *= OTHER_PROCESS_FACTOR
                note = Text(f"process {pid} is not one of the job's", f"进程 {pid} 不是作业的进程") if pid else note
            elif pid is not None or cause == "host_oom":
                weight = min(weight * UNLINKED_FACTOR, UNLINKED_CAP)
                role, rule = Role.CASCADE, f"kernel:unlinked:{cause}"
                note = note or Text("the kernel log does not say that this process was the job's",
                                    "内核日志没有说明这个进程属于作业")  # fmt: skip
            if weight <= 0:
                continue
            found.append(
                Observation(
                    source="kernel",
                    cause=cause,
                    weight=round(weight, 3),
                    role=role,
                    rule=rule,
                    text=clean_text(raw),
                    line=number,
                    note=note,
                    order=(-1, number),
                )
            )
    return found


def xid_lines(lines: Iterable[KernelLine]) -> list[tuple[int, KernelLine]]:
    """The NVIDIA Xid records among kernel-log lines, with their codes (doctor, monitor, exporter)."""
    from trainguard.diagnosis.signatures import default_table

    pattern = default_table().by_id("nvrm_xid").regex
    found = []
    for line in lines:
        if match := pattern.search(line.text.encode("utf-8", "replace")):
            found.append((int(match.group("xid")), line))
    return found
