"""``--help`` in Chinese. The English stays where it is written (docstrings and ``help=``); the Chinese
lives in data/help_zh.toml, keyed by command and option. :func:`localize` puts it on a Click command when
the group looks the command up, before Click formats the help; :class:`HelpContext` hands Click a
:class:`ZhHelpFormatter`, which writes Click's own words in Chinese and wraps by display width (a Chinese
character takes two columns). English help goes through none of this."""

from __future__ import annotations

import functools
import os
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import click

from trainguard._i18n import LANGUAGES, choose_language

HELP_FILE = "help_zh.toml"
ROOT = "trainguard"  # the group's table in the file; each command has the table of its name
CLICK = "click"  # Click's own words, by their English: these
CLICK_WORDS = ("Usage:", "Options", "Commands", "Positional arguments", "Show this message and exit.", "default: ")
_LANGUAGE = "trainguard.help_language"  # in ctx.meta, which every context of one command line shares


def language_in(args: Sequence[str], environ: Mapping[str, str]) -> str:
    """The language of a command line's help: its --lang (a job's own options, after --, are not
    ours), else the locale."""
    flag = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--lang" and i + 1 < len(args):
            flag = args[i + 1]
        elif arg.startswith("--lang="):
            flag = arg.partition("=")[2]
    return choose_language(flag if flag in LANGUAGES else None, environ)


def set_language(ctx: click.Context, lang: str) -> None:
    ctx.meta[_LANGUAGE] = lang


def language_of(ctx: click.Context) -> str:
    return ctx.meta.get(_LANGUAGE) or choose_language(None, os.environ)


@functools.cache
def translations() -> dict[str, Any]:
    """The file's tables; none (English help) when it cannot be read: asking for help never fails."""
    from trainguard._resources import load_toml

    try:
        return load_toml(HELP_FILE)
    except (OSError, ValueError):
        return {}


def _table(table: Any, key: str) -> Mapping[str, Any]:
    value = table.get(key) if isinstance(table, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _text(table: Mapping[str, Any], key: str, default: str | None) -> str | None:
    value = table.get(key)
    return value if isinstance(value, str) and value.strip() else default


def click_word(english: str) -> str:
    """One of Click's own words in Chinese (the English when the file lacks it)."""
    return _text(_table(translations(), CLICK), english, english) or english


def option_key(param: click.Parameter) -> str:
    """An option's key in the file: its long name as typed (``--exit-code``); an argument's: its name."""
    if isinstance(param, click.Option):
        return next((opt for opt in param.opts if opt.startswith("--")), param.opts[0])
    return param.name or ""


class _English(NamedTuple):
    help: str | None
    short_help: str | None
    context_class: type[click.Context]
    params: dict[click.Parameter, str | None]


# Each command's English as written, kept the first time it is put in Chinese, to put back.
_ENGLISH: weakref.WeakKeyDictionary[click.Command, _English] = weakref.WeakKeyDictionary()


def localize(command: click.Command, key: str, ctx: click.Context) -> None:
    """Give ``command`` (the group's table ``key``) its help texts in the language of ``ctx``: for zh
    those of the data file (a text the file lacks stays English, a key of it that names nothing is
    ignored), else the English as written. ``ctx`` is the command's own or its parent's context."""
    lang = language_of(ctx)
    if lang != "zh" and command not in _ENGLISH:
        return  # English as written: never touched
    help_option = command.get_help_option(ctx)  # created once per command, then cached by Click
    if command not in _ENGLISH:
        params = [p for p in (*command.params, help_option) if p is not None and getattr(p, "help", None)]
        _ENGLISH[command] = _English(command.help, command.short_help, command.context_class,
                                     {p: p.help for p in params})  # fmt: skip
    english = _ENGLISH[command]
    zh = lang == "zh"
    texts = _table(translations(), key) if zh else {}
    options = _table(texts, "options")
    command.help = _text(texts, "help", english.help)
    command.short_help = _text(texts, "short_help", english.short_help)
    command.context_class = HelpContext if zh else english.context_class
    for param, text in english.params.items():
        param.help = click_word(text) if zh and param is help_option else _text(options, option_key(param), text)


class HelpContext(click.Context):
    """A context whose help page is in the language of its command line."""

    def make_formatter(self) -> click.HelpFormatter:
        if language_of(self) == "zh":
            return ZhHelpFormatter(width=self.terminal_width, max_width=self.max_content_width)
        return super().make_formatter()


# ---------------------------------------------------------------------------------------------- wrapping
_WIDE = "\u2e80-\u9fff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"  # CJK characters and full-width punctuation
_OPENING = "（「『《【"
_CLOSING = "，。、；：！？）」』》】"


@functools.cache
def _tokens() -> re.Pattern[str]:
    """A run of spaces; a bracket without spaces ("[默认：10m]"); or a word, or one Chinese character, with
    the punctuation that may not be parted from it. Compiled on first use, not on every start-up (2 ms)."""
    return re.compile(rf"\s+|\[[^\s\[\]]*\]|[{_OPENING}]*(?:[^\s{_WIDE}]+|.)[{_CLOSING}]*")


def _wide(char: str) -> bool:
    import unicodedata  # here: English start-up has no use for it

    return unicodedata.east_asian_width(char) in "WF"


def display_width(text: str) -> int:
    return sum(2 if _wide(char) else 1 for char in text)


def _join(lines: Iterable[str]) -> str:
    """A paragraph's lines as one: a space between them, except between two Chinese characters."""
    text = ""
    for line in (line.strip() for line in lines):
        if text and line and not (_wide(text[-1]) and _wide(line[0])):
            text += " "
        text += line
    return text


def _fill(text: str, width: int) -> list[str]:
    """A paragraph in lines of at most ``width`` columns, broken between words and between Chinese
    characters, never before closing punctuation (a word longer than a line has a line of its own)."""
    lines: list[str] = []
    line, used, space = "", 0, ""
    for token in _tokens().findall(text):
        if token.isspace():
            space = token.replace("\n", " ") if line else ""
            continue
        size = display_width(token)
        if line and used + len(space) + size > width:
            lines.append(line)
            line, used = token, size
        else:
            line, used = line + space + token, used + len(space) + size
        space = ""
    return [*lines, line] if line else lines


def wrap(text: str, width: int, indent: int = 0) -> list[str]:
    """Click's paragraphs (a blank line between them; one whose first line is ``\\b`` is kept as it is)
    in lines of at most ``width`` columns, each after ``indent`` spaces and the paragraph's own."""
    paragraphs: list[tuple[int, bool, list[str]]] = []
    lines: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line:
            lines.append(line)
            continue
        if lines:
            raw = lines[0].strip() == "\b"
            paragraphs.append((len(lines[0]) - len(lines[0].lstrip()), raw, lines))
            lines = []
    out: list[str] = []
    for own, raw, lines in paragraphs:
        if out:
            out.append("")
        pad = " " * (indent + own)
        kept = lines[1:] if raw else _fill(_join(lines), width - indent - own)
        out.extend(pad + line for line in kept)
    return out


class ZhHelpFormatter(click.HelpFormatter):
    """Click's help page in Chinese: "Usage:", the section headings and "[default: …]" from the data file,
    every text wrapped by display width."""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        if prefix is None:
            prefix = click_word("Usage:")
            prefix += "" if _wide(prefix[-1]) else " "  # "用法：" needs no space after it
        lead = " " * self.current_indent + prefix + prog
        lines = _fill(args, max(self.width - display_width(lead) - 1, 20)) if args else []
        self.write(f"{lead} {lines[0]}\n" if lines else f"{lead}\n")
        for line in lines[1:]:
            self.write(" " * (display_width(lead) + 1) + line + "\n")

    def write_heading(self, heading: str) -> None:
        word = click_word(heading)
        self.write(f"{'':>{self.current_indent}}{word}{'：' if word != heading else ':'}\n")

    def write_text(self, text: str) -> None:
        self.write("\n".join(wrap(text, self.width, self.current_indent)) + "\n")

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max((display_width(first) for first, _ in rows), default=0), col_max) + col_spacing
        default = click_word("default: ")
        for first, second in rows:
            self.write(f"{'':>{self.current_indent}}{first}")
            if not second:
                self.write("\n")
                continue
            if display_width(first) <= first_col - col_spacing:
                self.write(" " * (first_col - display_width(first)))
            else:
                self.write("\n" + " " * (first_col + self.current_indent))
            # Click adds "  [default: X; range]" to an option's help: the last bracket.
            text = re.sub(r"\[default: (?=[^\[]*\]$)", lambda _: "[" + default, second)
            lines = wrap(text, max(self.width - first_col - 2, 10)) or [""]
            self.write(lines[0] + "\n")
            for line in lines[1:]:
                self.write(f"{'':>{first_col + self.current_indent}}{line}\n")
