"""What the run commands read from their command line: option values parsed into durations, sizes and
signal numbers (an unreadable one is a usage error naming its option), and the registry in which a
RUN argument is looked up."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from typing import TypeVar

import click

from trainguard._terminal import has_control, visible
from trainguard.errors import UsageError
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, close_runs_lost_to_reboot
from trainguard.units import parse_duration, parse_size

T = TypeVar("T")


def _parsed_by(parse: Callable[[str], T]) -> Callable[[click.Context, click.Parameter, str | None], T | None]:
    """An option callback reading the value with ``parse``; its ValueError becomes a usage error that
    names the option."""

    def callback(_ctx: click.Context, param: click.Parameter, value: str | None) -> T | None:
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as exc:
            flag = f"--{param.name.replace('_', '-')}"
            raise UsageError(f"{flag}: {exc}", f"{flag}：{exc}") from None

    return callback


as_duration = _parsed_by(parse_duration)  # 90s, 30m, 1h, or seconds: in seconds
as_size = _parsed_by(parse_size)  # 64G, 512M, or bytes: in bytes


def as_signal_number(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    """--stop-signal's value (TERM, SIGTERM, usr1) as its number."""
    name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise UsageError(f"--stop-signal: unknown signal {value!r}", f"--stop-signal：未知信号 {value!r}") from None


def _run_name(value: str) -> str:
    """A run name is printed by run, ps, status and top: one that a terminal would act on (ESC, BEL,
    a bidi override) or that hides itself (blank) is refused."""
    if not value.strip() or has_control(value):
        raise ValueError(f"{visible(value)!r} is not a usable name: give one without control characters")
    if not _utf8(value):
        raise ValueError(f"{visible(value)!r} is not a usable name: it is not valid UTF-8")
    if _RUN_ID.fullmatch(value):
        # A run is found by its id before its name: this name would reach another run, or none.
        raise ValueError(f"{value!r} is not a usable name: it looks like a run id (8 hex digits)")
    return value


_RUN_ID = re.compile(r"[0-9a-f]{8}")


def _utf8(text: str) -> bool:
    """Bytes that are not UTF-8 reach Python as lone surrogates, which no record can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


as_run_name = _parsed_by(_run_name)


def open_registry() -> Registry:
    """This machine's registry of runs; runs still recorded active from before its last boot are closed
    first (they died with it)."""
    registry = Registry(state_dir())
    close_runs_lost_to_reboot(registry)
    return registry
