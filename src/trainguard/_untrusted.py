"""Reading what the job or its launcher wrote: the progress file, error files, torchrun's files, rank
logs, launch records. Their writer is not trusted to be well-formed: a file may be huge, sparse, a
FIFO nobody writes, a device, nested JSON that overflows the parser, or fields of the wrong type.
Everything here is bounded, never blocks, and never raises: a failure is one warning (once per file
and reason) and the value is ignored, so nothing the job writes can stop its supervisor."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

log = logging.getLogger("trainguard.untrusted")

MAX_RECORD_BYTES = 1024 * 1024  # a progress file or launch record: a few KB when well-formed
MAX_ERROR_FILE_BYTES = 8 * 1024 * 1024  # an exception with a deep traceback (a RecursionError's)

_warned: set[tuple[str, str]] = set()


def warn_once(path: str, reason: str) -> None:
    if (path, reason) in _warned:
        return
    _warned.add((path, reason))
    log.warning("ignoring %s: %s", path, reason)


def open_regular(path: str) -> BinaryIO | None:
    """``path`` opened for reading if it is a regular file; None (and no wait) for anything else: a
    missing file, a FIFO, a device, a folder. Opened without blocking, so a FIFO with no writer cannot
    hold the reader."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            warn_once(path, "not a regular file")
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except OSError:
        with contextlib.suppress(OSError):
            os.close(fd)
        return None


def read_bounded(path: str, limit: int) -> bytes | None:
    """The whole content of a regular file of at most ``limit`` bytes; None for a larger one (read no
    further: a huge or sparse file costs nothing), a missing one or anything not a regular file."""
    handle = open_regular(path)
    if handle is None:
        return None
    with handle:
        try:
            data = handle.read(limit + 1)
        except OSError:
            return None
    if len(data) > limit:
        warn_once(path, f"larger than {limit} bytes")
        return None
    return data


def load_json(path: str, limit: int = MAX_RECORD_BYTES) -> Any | None:
    """The JSON value a file holds, or None for anything that is not a bounded, parseable one."""
    data = read_bounded(path, limit)
    if data is None:
        return None
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        warn_once(path, f"not readable JSON ({type(exc).__name__})")
        return None


def load_object(path: str, limit: int = MAX_RECORD_BYTES) -> dict[str, Any] | None:
    """A JSON object from a file, or None (a list, a number or garbage is not a record)."""
    value = load_json(path, limit)
    if value is None:
        return None
    if not isinstance(value, dict):
        warn_once(path, "not a JSON object")
        return None
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # not NaN


def is_text(value: Any) -> bool:
    return isinstance(value, str)


def typed_fields(path: str, record: Mapping[str, Any], schema: Mapping[str, Callable[[Any], bool]]) -> dict[str, Any]:
    """The fields of ``record`` that ``schema`` knows and whose value passes its check; each other
    field is dropped with one warning, so what reaches the supervisor has the types it expects."""
    kept = {}
    for key, value in record.items():
        check = schema.get(key)
        if check is not None and check(value):
            kept[key] = value
        elif check is not None:
            warn_once(path, f"field {key!r} has a value of the wrong kind")
    return kept
