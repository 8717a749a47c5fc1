"""The signature table (data/signatures.toml) and the Xid table (data/xids.json) as typed rows."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cache

from trainguard._i18n import Text
from trainguard._resources import load_json, load_toml
from trainguard.causes import CAUSE_IDS
from trainguard.errors import DataError

XID_CAUSE = "xid"  # the cause of such a row comes from the Xid table


class Role(str, Enum):
    ROOT = "root"
    CASCADE = "cascade"
    WRAPPER = "wrapper"
    # Circumstantial: RAM at 99 % or a nearly full disk before a death makes a cause that other
    # evidence names more certain, but names no cause by itself (a full disk does not SIGKILL a job).
    SUPPORT = "support"


@dataclass(frozen=True)
class Signature:
    id: str
    cause: str
    pattern: str
    weight: float
    role: Role
    source: str
    icase: bool = False
    kernel: bool = False
    examples: tuple[str, ...] = ()
    # A line that can mean several things (CUDNN_STATUS_EXECUTION_FAILED): every reading counts,
    # each at its own weight, and the other readings stand as alternatives.
    also: tuple[tuple[str, float], ...] = ()
    # A context row: it names no cause by itself; within ``window`` lines after it, an observation of
    # one of the ``rereads`` rules is read as this row's cause (errno 28 under multiprocessing's
    # SemLock is /dev/shm, not the disk).
    rereads: tuple[str, ...] = ()
    window: int = 0
    # Rows this one is more specific than: where both match one line, this row reads it, however
    # heavy theirs ("unhandled system error" is its own question, whatever "NCCL error" says).
    narrows: tuple[str, ...] = ()
    sigkill: bool = False  # the line says a process was SIGKILLed: the OOM killer, or someone else
    # The one event that this row and others only report ("sigkill", "sigsegv"): however many of
    # them print it, together they are one witness.
    witness: str | None = None
    regex: re.Pattern[bytes] = field(compare=False, repr=False, default=None)  # type: ignore[assignment]


@dataclass(frozen=True)
class ExitRule:
    cause: str
    weight: float
    role: Role
    source: str
    signal: str | None = None
    code: int | None = None
    sigkill: bool = False
    witness: str | None = None


@dataclass(frozen=True)
class XidInfo:
    xid: int
    name: str
    cause: str
    weight: float
    action: str
    immediate_action: str


@dataclass(frozen=True)
class SilentEnd:
    """How to read a log that reports no failure at all, when the log is all there is."""

    readings: tuple[tuple[str, float], ...]
    text: Text
    note: Text
    source: str


@dataclass(frozen=True)
class SignatureTable:
    signatures: tuple[Signature, ...]
    exit_rules: tuple[ExitRule, ...]
    silent_end: SilentEnd | None = None

    def by_id(self, signature_id: str) -> Signature:
        for sig in self.signatures:
            if sig.id == signature_id:
                return sig
        raise KeyError(signature_id)


_FORBIDDEN = (
    (r"\s", "use [ \\t]: \\s can match a newline"),
    (r"\d", "use [0-9]: POSIX ERE has no \\d"),
    ("(?=", "no lookahead"),
    ("(?!", "no lookahead"),
    ("(?<=", "no lookbehind"),
    ("(?<!", "no lookbehind"),
)


def _compile(row_id: str, pattern: str, icase: bool) -> re.Pattern[bytes]:
    for token, why in _FORBIDDEN:
        if token in pattern:
            raise DataError(f"signature {row_id!r}: {token!r} is not allowed ({why})")
    flags = re.MULTILINE | (re.IGNORECASE if icase else 0)
    try:
        return re.compile(pattern.encode(), flags)
    except re.error as exc:
        raise DataError(f"signature {row_id!r}: bad pattern: {exc}") from exc


def parse_table(raw: dict) -> SignatureTable:
    signatures = []
    seen: set[str] = set()
    for row in raw.get("signature", []):
        try:
            sig_id = row["id"]
            cause = row["cause"]
            role = Role(row["role"])
            weight = float(row["weight"])
            pattern = row["pattern"]
            source = row["source"]
        except (KeyError, ValueError) as exc:
            raise DataError(f"signatures.toml: bad row {row.get('id', '?')!r}: {exc}") from exc
        if sig_id in seen:
            raise DataError(f"signatures.toml: duplicate id {sig_id!r}")
        seen.add(sig_id)
        if cause != XID_CAUSE and cause not in CAUSE_IDS:
            raise DataError(f"signature {sig_id!r}: unknown cause {cause!r}")
        if not 0.0 <= weight <= 1.0:
            raise DataError(f"signature {sig_id!r}: weight {weight} outside 0..1")
        regex = _compile(sig_id, pattern, bool(row.get("icase", False)))
        if cause == XID_CAUSE and "xid" not in regex.groupindex:
            raise DataError(f"signature {sig_id!r}: an xid row needs a (?P<xid>...) group")
        also = tuple((str(c), float(w)) for c, w in row.get("also", ()))
        for other, other_weight in also:
            if other not in CAUSE_IDS or not 0.0 <= other_weight <= 1.0:
                raise DataError(f"signature {sig_id!r}: bad alternative reading {other!r} {other_weight}")
        rereads = tuple(row.get("rereads", ()))
        if bool(rereads) != bool(row.get("window")):
            raise DataError(f"signature {sig_id!r}: a context row needs both rereads and window")
        signatures.append(
            Signature(
                id=sig_id,
                cause=cause,
                pattern=pattern,
                weight=weight,
                role=role,
                source=source,
                icase=bool(row.get("icase", False)),
                kernel=bool(row.get("kernel", False)),
                examples=tuple(row.get("examples", ())),
                also=also,
                rereads=rereads,
                window=int(row.get("window", 0)),
                narrows=tuple(row.get("narrows", ())),
                sigkill=bool(row.get("sigkill", False)),
                witness=_witness(row),
                regex=regex,
            )
        )
    known = {sig.id for sig in signatures}
    for sig in signatures:
        if unknown := set(sig.rereads) - known:
            raise DataError(f"signature {sig.id!r}: rereads unknown rows {sorted(unknown)}")
        if unknown := set(sig.narrows) - known:
            raise DataError(f"signature {sig.id!r}: narrows unknown rows {sorted(unknown)}")
    exit_rules = []
    for row in raw.get("exit", []):
        if ("signal" in row) == ("code" in row):
            raise DataError(f"signatures.toml: an [[exit]] row needs exactly one of signal / code: {row}")
        if row["cause"] not in CAUSE_IDS:
            raise DataError(f"signatures.toml: [[exit]] row with unknown cause {row['cause']!r}")
        exit_rules.append(
            ExitRule(
                cause=row["cause"],
                weight=float(row["weight"]),
                role=Role(row.get("role", "root")),
                source=row["source"],
                signal=row.get("signal"),
                code=row.get("code"),
                sigkill=bool(row.get("sigkill", False)),
                witness=_witness(row),
            )
        )
    return SignatureTable(tuple(signatures), tuple(exit_rules), _parse_silent_end(raw.get("silent_end")))


def _witness(row: dict) -> str | None:
    """The event a row reports with others: its own ``witness``, or "sigkill" for a row that says a
    process was SIGKILLed (every such line reports one event whose sender it cannot know)."""
    return row.get("witness") or ("sigkill" if row.get("sigkill") else None)


def _parse_silent_end(row: dict | None) -> SilentEnd | None:
    if row is None:
        return None
    readings = tuple((cause, float(weight)) for cause, weight in row["readings"])
    if unknown := {cause for cause, _ in readings} - set(CAUSE_IDS):
        raise DataError(f"signatures.toml: [silent_end] names unknown causes {sorted(unknown)}")
    return SilentEnd(
        readings=readings,
        text=Text(row["text"]["en"], row["text"]["zh"]),
        note=Text(row["note"]["en"], row["note"]["zh"]),
        source=row["source"],
    )


@cache
def default_table() -> SignatureTable:
    return parse_table(load_toml("signatures.toml"))


@cache
def xid_table() -> tuple[dict[int, XidInfo], XidInfo]:
    raw = load_json("xids.json")
    table = {
        row["xid"]: XidInfo(
            xid=row["xid"],
            name=row["name"],
            cause=row["cause"],
            weight=float(row["weight"]),
            action=row["action"],
            immediate_action=row["immediate_action"],
        )
        for row in raw["xids"]
    }
    unknown = raw["unknown_xid"]
    fallback = XidInfo(-1, "Xid not in the catalogue", unknown["cause"], float(unknown["weight"]), "", "")
    return table, fallback


def lookup_xid(code: int) -> XidInfo:
    table, fallback = xid_table()
    info = table.get(code)
    if info is None:
        return XidInfo(code, fallback.name, fallback.cause, fallback.weight, fallback.action, fallback.immediate_action)
    return info
