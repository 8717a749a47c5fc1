"""Click's own errors in Chinese (data/click_errors_zh.toml, cli/errors_zh.py): each error a user can
reach on the command line comes whole in Chinese under a zh locale (before: Click's English quoted in a
Chinese frame), in English as Click writes it otherwise, and the catalogue's templates are Click's own."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from trainguard._resources import load_toml
from trainguard.cli import errors_zh
from trainguard.cli.main import main

CLICK_SOURCE = "\n".join(p.read_text() for p in Path(click.__file__).parent.glob("*.py"))
ENGLISH_WORDS = re.compile(r"\b(Invalid|value|is not|Missing|No such|unexpected|Did you mean|range)\b")


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lang: str, *argv: str):
    for name in ("LC_ALL", "LC_MESSAGES", "LANGUAGE", "TRAINGUARD_LANG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", lang)
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


def reachable_errors(tmp_path: Path) -> list[tuple[tuple[str, ...], str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return [
        (("run", "--max-restarts", "abc", "--", "true"), "「--max-restarts」 的值无效：「abc」 不是有效的整数。"),
        (("run", "--max-restarts", "99999", "--", "true"), "「--max-restarts」 的值无效：99999 不在范围 0<=x<=10000 内。"),
        (("run", "--nam", "x", "--", "true"), "没有这个选项：「--nam」。是否想用 「--name」？"),
        (("stauts",), "没有这个命令：「stauts」。"),
        (("status", "a", "b", "c"), "多余的参数（b c）"),
        (("logs",), "缺少参数 「RUN」。"),
        (("run", "--restart", "sometimes", "--", "true"),
         "「--restart」 的值无效：「sometimes」 不是 「never」、「on-failure」、「always」 之一。"),
        (("run", "--checkpoint-dir", str(a_file), "--", "true"),
         f"「--checkpoint-dir」 的值无效：文件夹 「{a_file}」 是一个文件。"),
        (("logs", "x", "--attempt"), "选项 「--attempt」 需要一个值。"),
    ]  # fmt: skip


def test_each_reachable_click_error_is_chinese_under_a_zh_locale(tmp_path, monkeypatch, capsys) -> None:
    for argv, chinese in reachable_errors(tmp_path):
        code, said = run_main(monkeypatch, capsys, "zh_CN.UTF-8", *argv)
        assert code == 2, argv
        assert said == f"trainguard: {chinese}", argv
        assert not ENGLISH_WORDS.search(said), said


def test_the_same_errors_stay_clicks_english_elsewhere(tmp_path, monkeypatch, capsys) -> None:
    for argv, _ in reachable_errors(tmp_path):
        code, said = run_main(monkeypatch, capsys, "C.UTF-8", *argv)
        assert code == 2 and said.startswith("trainguard: ") and not re.search(r"[\u4e00-\u9fff]", said), said


def test_a_message_no_template_knows_keeps_clicks_english_quoted() -> None:
    assert errors_zh.translate("Something Click may say one day.") is None


def test_each_template_is_clicks_own_and_reads_back_as_itself() -> None:
    """A template Click no longer writes would never match (Click changed its words): each piece of
    each is in Click's source (some messages Click puts together from two, "Missing argument" and
    its hint). And each, filled in, is matched by its own row, not a looser one."""
    messages = load_toml(errors_zh.CATALOGUE)["messages"]
    for english, chinese in messages.items():
        pieces = [p.strip(" .:") for p in re.split(r"\{\w+(?:![rs])?\}", english)]
        assert all(piece in CLICK_SOURCE for piece in pieces if piece), english
        filled = re.sub(r"\{(\w+)(?:![rs])?\}", lambda m: f"<{m.group(1)}>", english)
        expected = re.sub(r"\{(\w+)\}", lambda m: f"<{m.group(1)}>", chinese)
        assert errors_zh.translate(filled) == expected, english
