"""Durations and sizes as people write them: "90s", "30m", "1h", "1.5h"; "512M", "16G", "1.5GiB"."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(ms|s|sec|m|min|h|hr|d)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {
    None: 1.0,
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_duration(value: float | int | str) -> float:
    """Seconds from a number of seconds or a string such as "90s", "30m", "1h". Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"not a duration: {value!r} (use seconds or e.g. 90s, 30m, 1h)")
        unit = match.group(2).lower() if match.group(2) else None
        seconds = float(match.group(1)) * _DURATION_UNITS[unit]
    if seconds <= 0:
        raise ValueError(f"a duration must be positive: {value!r}")
    return seconds


def parse_size(value: int | str) -> int:
    """Bytes from a number or a string such as "512M", "16G", "1.5GiB" (powers of 1024). Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(value)
        if match is None:
            raise ValueError(f"not a size: {value!r} (use bytes or e.g. 512M, 16G)")
        size = int(float(match.group(1)) * 1024 ** _SIZE_POWERS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"a size must be positive: {value!r}")
    return size
