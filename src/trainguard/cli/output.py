"""Where the commands' output goes and in which language: a terminal gets colour and its width; a pipe
or a file gets plain lines, never cut at 80 columns and never padded with trailing spaces (scripts read
them); a message is said in the language of the environment (LC_ALL, LC_MESSAGES, LANG)."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from trainguard._i18n import choose_language


def say(en: str, zh: str) -> str:
    """The message in the language of the environment, read at each call."""
    return zh if choose_language(None, os.environ) == "zh" else en


class _TrimmedLines:
    """A file that writes each line without its trailing spaces (rich pads table cells)."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._target.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._target.write(self._pending.rstrip(" "))
            self._pending = ""
        self._target.flush()

    def isatty(self) -> bool:
        return False


def console(**options: Any):
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # `trainguard diagnose LOG | head`: the reader left, which is not an error (rich exits 1).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise SystemExit(0)

    if sys.stdout.isatty():
        return _Console(highlight=False, **options)
    return _Console(highlight=False, file=_TrimmedLines(sys.stdout), width=1 << 16, color_system=None,
                    soft_wrap=True, **options)  # fmt: skip
