"""Which rank failed first: the time a line was printed and the rank (and host) that printed it, read
from the prefixes launchers and loggers put on lines. Pure functions of text.

Ranks of one job print through the same launcher and the same libraries, so their timestamps share a
format: comparing them across the ranks' logs orders the failures, and the earliest one is where
the root cause is (the others' NCCL timeouts and lost connections are its echoes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# (pattern, has a year). Each yields the groups month, day, hour, minute, second (fraction optional).
_STAMPS = (
    # 2023-06-01 02:36:49,208 / 2023-06-01T02:36:49.208Z / [2023-06-01 02:36:49]
    (re.compile(r"(?P<year>20[0-9]{2})-(?P<month>[01][0-9])-(?P<day>[0-3][0-9])[T ](?P<hour>[0-2][0-9]):(?P<minute>[0-5][0-9]):(?P<second>[0-6][0-9](?:[.,][0-9]+)?)"), True),
    # glog / absl / c10: E0525 12:35:32.850440, [E704 13:48:58.260494728 ...]
    (re.compile(r"(?:^|[\[ ])[IWEF](?P<month>[01]?[0-9])(?P<day>[0-3][0-9]) (?P<hour>[0-2][0-9]):(?P<minute>[0-5][0-9]):(?P<second>[0-6][0-9](?:\.[0-9]+)?)"), False),
    # vLLM and friends: INFO 05-27 11:47:41
    (re.compile(r"(?:^|[ \[])(?P<month>[01][0-9])-(?P<day>[0-3][0-9]) (?P<hour>[0-2][0-9]):(?P<minute>[0-5][0-9]):(?P<second>[0-6][0-9](?:\.[0-9]+)?)"), False),
)
_RANK_PREFIX = re.compile(r"\[(?:rank|default)(?P<rank>[0-9]+)\]")
_RANK_FIELD = re.compile(r"\b(?:rank|RANK|local_rank)[ =:]+(?P<rank>[0-9]+)\b")
_RANK_IN_NAME = re.compile(r"(?:rank|node|worker)[-_.]?(?P<rank>[0-9]+)|/attempt_[0-9]+/(?P<local>[0-9]+)/")
_NCCL_HOST = re.compile(r"^(?P<host>[A-Za-z][-A-Za-z0-9_.]*):[0-9]+:[0-9]+ \[[0-9]+\]")


@dataclass(frozen=True)
class Stamp:
    text: str  # as printed
    key: float  # orders stamps of one format: seconds, from the year (or the month) on


def line_time(line: str) -> Stamp | None:
    for pattern, has_year in _STAMPS:
        found = pattern.search(line)
        if found is None:
            continue
        g = found.groupdict()
        seconds = float(g["second"].replace(",", "."))
        key = ((int(g["month"]) * 31 + int(g["day"])) * 24 + int(g["hour"])) * 3600 + int(g["minute"]) * 60 + seconds
        if has_year:
            key += int(g["year"]) * 400 * 86400
        return Stamp(found.group(0).strip(" ["), key)
    return None


def line_rank(line: str) -> int | None:
    for pattern in (_RANK_PREFIX, _RANK_FIELD):
        if found := pattern.search(line):
            return int(found.group("rank"))
    return None


def name_rank(name: str | None) -> int | None:
    if not name:
        return None
    matches = list(_RANK_IN_NAME.finditer(name))
    if not matches:
        return None
    last = matches[-1]  # the innermost: a rank folder inside an attempt folder
    return int(last.group("rank") or last.group("local"))


def line_host(line: str) -> str | None:
    found = _NCCL_HOST.search(line)
    return found.group("host") if found else None
