"""Which language a person reads: ``--lang``, else LC_ALL / LC_MESSAGES / LANG, else English."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

LANGUAGES = ("en", "zh")


def choose_language(flag: str | None, environ: Mapping[str, str]) -> str:
    if flag:
        return flag
    # POSIX precedence: LC_ALL overrides LC_MESSAGES, which overrides LANG.
    for var in ("LC_ALL", "LC_MESSAGES", "LANG"):
        value = environ.get(var, "")
        if value:
            return "zh" if value.lower().startswith("zh") else "en"
    return "en"


def pick(texts: Mapping[str, str], lang: str) -> str:
    return texts.get(lang) or texts["en"]


class Text(NamedTuple):
    """One thing said in both languages."""

    en: str
    zh: str

    def pick(self, lang: str) -> str:
        return self.zh if lang == "zh" else self.en
