"""The error file: an uncaught exception in the training script, written as JSON where the
supervisor reads it (TRAINGUARD_ERROR_FILE), so a diagnosis sees the real exception, not only a tail.
In a job of several ranks (a launcher sets ``RANK``) rank 0 writes the file itself and rank N
``<file>.rank<N>``: every rank's exception is kept, and the supervisor knows whose it is."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

ERROR_FILE_ENV = "TRAINGUARD_ERROR_FILE"
F = TypeVar("F", bound=Callable[..., Any])


def write_error_file(exc: BaseException, path: str | None = None) -> str | None:
    """Write ``exc`` as {"type", "message", "traceback", "time", "pid"}; atomically, never raising."""
    if path is None:
        path = os.environ.get(ERROR_FILE_ENV)
        rank = os.environ.get("RANK", "0")
        if path and rank not in ("", "0"):
            path = f"{path}.rank{rank}"
    if not path:
        return None
    payload = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "time": time.time(),
        "pid": os.getpid(),
    }
    try:
        folder = os.path.dirname(os.path.abspath(path))
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, prefix=".tmp-error-", encoding="utf-8") as out:
            json.dump(payload, out)
        os.replace(out.name, path)
    except OSError:
        return None  # reporting an error must never cause another
    return path


def record(fn: F) -> F:
    """Decorate the training entry point: an uncaught exception is written to the error file, then
    re-raised unchanged."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SystemExit:
            raise
        except BaseException as exc:
            write_error_file(exc)
            raise

    return wrapper  # type: ignore[return-value]


_installed = False


def install_excepthook() -> None:
    """Chain an exception hook that writes the error file (done on import under ``trainguard run``)."""
    global _installed
    if _installed:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            write_error_file(exc.with_traceback(tb))
        previous(kind, exc, tb)

    sys.excepthook = hook
    _installed = True
