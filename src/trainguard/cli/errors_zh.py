"""Click's own error messages in Chinese. Click writes them in English from templates it marks for
gettext; data/click_errors_zh.toml holds those templates' Chinese. :func:`translate` matches a whole
message against the templates (the one with the most fixed text first: "is not a valid {type}" before
"is not {choice}"), and translates again the fields that are messages themselves. Pure: no I/O but the
data file, read once."""

from __future__ import annotations

import functools
import re
from typing import Any, NamedTuple

CATALOGUE = "click_errors_zh.toml"
_FIELD = re.compile(r"\{(\w+)(?:![rs])?\}")
# What Click quotes with repr(): one value ('abc'), a list ('a', 'b') or an option's names ('-r' / '--restart')
_QUOTED = re.compile(r"'[^']*'(?:(?:, | / )'[^']*')*")


class _Row(NamedTuple):
    pattern: re.Pattern[str]
    zh: str
    fixed_text: int  # characters outside the fields: more is more specific


def _row(english: str, zh: str) -> _Row:
    parts, last, fields = [], 0, set()
    for match in _FIELD.finditer(english):
        parts.append(re.escape(english[last:match.start()]))
        name = match.group(1)
        if name in fields:  # would need a back-reference; no template of Click's does it
            raise ValueError(f"{CATALOGUE}: {english!r} names {{{name}}} twice")
        fields.add(name)
        parts.append(f"(?P<{name}>.+?)")
        last = match.end()
    parts.append(re.escape(english[last:]))
    fixed = len(_FIELD.sub("", english))
    return _Row(re.compile("".join(parts), re.DOTALL), zh, fixed)


@functools.cache
def _catalogue() -> tuple[tuple[_Row, ...], dict[str, str]]:
    from trainguard._resources import load_toml

    try:
        data: dict[str, Any] = load_toml(CATALOGUE)
    except (OSError, ValueError):
        return (), {}  # an error message never fails for want of its translation
    rows = sorted((_row(en, zh) for en, zh in data.get("messages", {}).items()), key=lambda r: -r.fixed_text)
    return tuple(rows), dict(data.get("words", {}))


def translate(message: str) -> str | None:
    """The Chinese of one of Click's messages; None when no template matches it."""
    rows, words = _catalogue()
    for row in rows:
        match = row.pattern.fullmatch(message)
        if match is None:
            continue
        fields = {name: _field(value, words) for name, value in match.groupdict().items()}
        return row.zh.format(**fields)
    return None


def _field(value: str, words: dict[str, str]) -> str:
    if value in words:
        return words[value]
    if _QUOTED.fullmatch(value):
        # Chinese quotes what it names in 「」 and lists with 、; English quotes would read as English
        return re.sub(r"'([^']*)'", r"「\1」", value).replace("」, 「", "」、「")
    inner = translate(value) if " " in value else None
    return inner if inner is not None else value
