"""One exception tree for everything trainguard reports to a person.

Adapters translate third-party and OS errors into these at the boundary (``raise ... from exc``); the
CLI catches only :class:`TrainguardError`, prints its one-line message and exits with its code.
"""

from __future__ import annotations


class TrainguardError(Exception):
    """An error a person can act on. ``exit_code`` follows DESIGN section 5 (2 = bad usage/input)."""

    exit_code = 1

    def __init__(self, message_en: str, message_zh: str | None = None) -> None:
        super().__init__(message_en)
        self.message_en = message_en
        self.message_zh = message_zh or message_en

    def message(self, lang: str) -> str:
        return self.message_zh if lang == "zh" else self.message_en


class UsageError(TrainguardError):
    """Bad arguments or unreadable input."""

    exit_code = 2


class InputError(UsageError):
    """Input that cannot be read: a missing, unreadable, binary or directory path."""


class DataError(TrainguardError):
    """A data file shipped with trainguard is malformed (a packaging bug, not the user's)."""

    exit_code = 2
