"""Text bound for a terminal: every control character that could drive it is shown as an escape, the
rest (tabs, Chinese, emoji) is kept as it is."""

from __future__ import annotations

import pytest

from trainguard._terminal import has_control, visible


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # a window title set by a log line (OSC ... BEL)
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear the screen, cursor home
        ("name\u202egpj.exe", "name\\u202egpj.exe"),  # right-to-left override
        ("\u2066x\u2069 \u202a", "\\u2066x\\u2069 \\u202a"),  # isolates and embeddings
        ("a\x9b31mb\x7f\x00", "a\\x9b31mb\\x7f\\x00"),  # C1 CSI, DEL, NUL
        ("line one\nline two\r", "line one\\nline two\\r"),
    ],
)
def test_control_characters_are_made_visible(raw: str, shown: str) -> None:
    assert visible(raw) == shown
    assert has_control(raw) and not has_control(shown)


def test_ordinary_text_is_kept_as_it_is() -> None:
    text = "训练 résnet-50 \U0001f680 步 100\tloss 0.25 C:\\runs \u200d"
    assert visible(text) == text
    assert not has_control("训练 résnet-50 \U0001f680")
    assert has_control("a\tb")  # kept in a log line, refused in a name
