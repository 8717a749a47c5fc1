"""Durations and sizes as people write them: "90s", "30m", "1h", "1.5h"; "512M", "16G", "1.5GiB"."""

from __future__ import annotations

import math
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
    if not math.isfinite(seconds) or seconds <= 0:  # nan compares false with everything: never due
        raise ValueError(f"a duration must be positive and finite: {value!r}")
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


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: "0.4 s", "42 s", "7m05s", "3h12m", "2d04h"."""
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def format_size(size: float) -> str:
    """Bytes in powers of 1024 with one decimal where it helps: "812 MiB", "1.5 GiB", "23 GiB"."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" or abs(value) >= 10 else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
