"""Text that reaches a terminal, made harmless (PURE): run names, commands and lines quoted from a
job's log are written by the job or its user, and a terminal obeys the control characters in them
(ESC starts a sequence that can retitle the window or move the cursor, BEL rings, U+202E reverses
what follows). ``visible`` shows each such character as an escape (``\\x1b``, ``\\u202e``) and keeps
every other character, Chinese included; ``has_control`` tells a name that holds one."""

from __future__ import annotations

import re

# C0 but tab (which a log line may hold and a terminal only spaces out), DEL, C1, and the bidi
# overrides and isolates (U+202A-U+202E, U+2066-U+2069) that reorder the text after them.
_CONTROL_CODES = [*(c for c in range(0x20) if c != 0x09), *range(0x7F, 0xA0)]
_BIDI_CODES = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_SHOWN_AS = ({c: f"\\x{c:02x}" for c in _CONTROL_CODES} | {0x0A: "\\n", 0x0D: "\\r"}
             | {c: f"\\u{c:04x}" for c in _BIDI_CODES})  # fmt: skip
_ANY_CONTROL = re.compile("[" + "".join(re.escape(chr(c)) for c in [0x09, *_SHOWN_AS]) + "]")


def visible(text: str) -> str:
    """``text`` with every control character written out as its escape; all else as it is. One line in,
    one line out: a newline is shown as ``\\n`` too, so split a text into lines first."""
    return text.translate(_SHOWN_AS)


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character that ``visible`` would show, or a tab: neither has a
    place in a name."""
    return _ANY_CONTROL.search(text) is not None
