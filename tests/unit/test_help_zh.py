"""`--help` in Chinese (data/help_zh.toml, cli/help_zh.py): every help text a person reads has its
Chinese, the file names no command or option that is gone, each page renders, and the English help is
exactly Click's as before."""

from __future__ import annotations

import os
import re
import subprocess
import unicodedata
from collections.abc import Iterator

import click
import pytest

from tests.conftest import trainguard_cmd
from trainguard.cli import help_zh
from trainguard.cli.main import cli, main

NAMES = cli.list_commands(click.Context(cli))
LOCALE = ("LC_ALL", "LC_MESSAGES", "LANG")
CLICKS_ENGLISH = ("Usage:", "Options:", "Commands:", "Show this message", "[default:", "\b")
WIDE = re.compile(r"[\u2e80-\u9fff\uff00-\uffef]")


def english_commands() -> dict[str, click.Command]:
    """The group and each of its commands (loaded: the group imports a command's module on first use),
    with their help in English as written."""
    ctx = click.Context(cli, info_name="trainguard", help_option_names=["-h", "--help"])
    help_zh.set_language(ctx, "en")
    help_zh.localize(cli, help_zh.ROOT, ctx)
    return {help_zh.ROOT: cli, **{name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}}


def english_texts(command: click.Command) -> dict[str, str]:
    """The help texts of ``command`` by their key in the file: help, and each option's as written."""
    texts = {"help": command.help or ""}
    texts.update((help_zh.option_key(p), p.help) for p in command.params if getattr(p, "help", None))
    return texts


@pytest.fixture(autouse=True)
def english_again() -> Iterator[None]:
    """Tests here put the commands in Chinese in this process: put them back in English after each."""
    yield
    english_commands()


def display_width(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in line)


def squeezed(text: str) -> str:
    """Text without the spaces, line breaks and \\b markers that wrapping adds or removes."""
    return re.sub(r"[\s\x08]", "", text)


def trainguard(*args: str, **locale: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (*LOCALE, "COLUMNS")}
    env.update(COLUMNS="80", **locale)
    return subprocess.run([*trainguard_cmd(), *args], capture_output=True, text=True, env=env, timeout=120,
                          check=False)  # fmt: skip


# ---------------------------------------------------------------------------------------------- the file
def test_every_command_and_option_has_its_chinese_help() -> None:
    zh = help_zh.translations()
    missing = []
    for name, command in english_commands().items():
        texts = zh.get(name, {})
        wanted = ["help"] if name == help_zh.ROOT else ["help", "short_help"]
        missing += [f"[{name}] {key}" for key in wanted if not str(texts.get(key, "")).strip()]
        options = texts.get("options", {})
        missing += [f'[{name}.options] "{key}"' for key in english_texts(command)
                    if key != "help" and not str(options.get(key, "")).strip()]  # fmt: skip
    assert missing == [], f"no Chinese help in {help_zh.HELP_FILE} for: {missing}"


def test_the_file_names_only_commands_and_options_that_exist() -> None:
    zh = help_zh.translations()
    commands = english_commands()
    stray = [f"[{name}]" for name in zh if name not in (*commands, help_zh.CLICK)]
    for name, texts in zh.items():
        if name in commands:
            stray += [f"[{name}] {key}" for key in texts if key not in ("help", "short_help", "options")]
            options = set(english_texts(commands[name])) - {"help"}
            stray += [f'[{name}.options] "{key}"' for key in texts.get("options", {}) if key not in options]
    assert stray == [], f"{help_zh.HELP_FILE} names what no command has: {stray}"
    assert sorted(zh[help_zh.CLICK]) == sorted(help_zh.CLICK_WORDS)


# What a translation keeps as the English has it: options, placeholders, environment variables, names in
# capitals (RUN, CMD, GPU, JSON, SIGKILL), numbers with their units, and the \b no-rewrap markers.
_KEPT = re.compile(r"(?<![\w-])--?[a-z][\w-]*|\{\w+\}|\$?\b[A-Z]{2,}[A-Z0-9_]*\b|\b\d+(?:\.\d+)*[a-zA-Z]*\b|\x08")
_TRANSLATED = {"COMPLETE"}  # capitals for emphasis


def test_translations_keep_names_placeholders_and_markers() -> None:
    zh = help_zh.translations()
    lost = []
    for name, command in english_commands().items():
        for key, english in english_texts(command).items():
            table = zh.get(name, {}) if key == "help" else zh.get(name, {}).get("options", {})
            chinese = table.get(key) or english  # a missing one is the test above's
            kept = [t for t in _KEPT.findall(english) if t not in _TRANSLATED]
            lost += [f"[{name}] {key}: {t!r}" for t in kept if chinese.count(t) < english.count(t)]
    assert lost == []


# ---------------------------------------------------------------------------------------------- rendering
@pytest.mark.parametrize("name", ["", *NAMES], ids=lambda name: name or "trainguard")
def test_every_help_page_renders_in_chinese(name: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for var in LOCALE:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    monkeypatch.setenv("COLUMNS", "100")
    assert main([name, "--help"] if name else ["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"用法：trainguard {name}".rstrip() + " "), out
    texts = help_zh.translations()[name or help_zh.ROOT]
    assert squeezed(texts["help"]) in squeezed(out)
    for key, text in texts.get("options", {}).items():
        assert key in out and squeezed(text) in squeezed(out)
    assert "选项：" in out and "-h, --help" in out and "显示此帮助信息并退出。" in out
    assert [word for word in CLICKS_ENGLISH if word in out] == []
    too_wide = [line for line in out.splitlines() if WIDE.search(line) and display_width(line) > 98]
    assert too_wide == []
    if not name:
        for command in NAMES:
            assert squeezed(help_zh.translations()[command]["short_help"]) in squeezed(out)


def test_missing_or_stray_translations_leave_english(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    broken = {"click": "not a table", "ghost": {"help": "幽灵"},
              "run": {"help": 7, "short_help": "", "options": {"--no-such-option": "无", "--name": ["x"],
                                                                "--grace": "宽限期。"}}}  # fmt: skip
    monkeypatch.setattr(help_zh, "translations", lambda: broken)
    monkeypatch.setenv("LC_ALL", "zh_CN.UTF-8")
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: trainguard run ")
    assert "Run a training job that survives disconnects" in out and "A name that stands for the run" in out
    assert "宽限期。" in out and "Show this message and exit." in out


def test_wrapping_counts_a_chinese_character_as_two_columns() -> None:
    *filled, blank, raw = help_zh.wrap("检查点" * 20 + "，（--checkpoint-dir）。\n\n\b\n  原样  保留", 30, indent=2)
    assert all(display_width(line) <= 30 and line.startswith("  ") for line in filled)
    assert "".join(line.strip() for line in filled) == "检查点" * 20 + "，（--checkpoint-dir）。"
    assert not any(line.strip().startswith(("，", "）", "。")) for line in filled)  # never before closing marks
    assert blank == "" and raw == "    原样  保留"  # after \b: as written


# ---------------------------------------------------------------------------------------------- the command
def test_run_help_is_chinese_under_a_chinese_locale() -> None:
    done = trainguard("run", "--help", LANG="zh_CN.UTF-8")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("用法：trainguard run [OPTIONS] -- CMD [ARGS]...\n")
    texts = help_zh.translations()["run"]
    assert squeezed(texts["help"]) in squeezed(out)
    for key, text in texts["options"].items():
        assert key in out and squeezed(text) in squeezed(out)
    assert "选项：" in out and "[默认：on-failure]" in out and "显示此帮助信息并退出。" in out
    assert "Options:" not in out and "Show this message" not in out


def test_run_help_is_clicks_english_otherwise() -> None:
    done = trainguard("run", "--help", LANG="C")
    assert done.returncode == 0, done.stderr
    commands = english_commands()
    parent = click.Context(cli, info_name="trainguard", help_option_names=["-h", "--help"], terminal_width=78,
                           max_content_width=100)  # fmt: skip
    expected = commands["run"].get_help(click.Context(commands["run"], info_name="run", parent=parent))
    assert done.stdout == expected + "\n"
    assert not WIDE.search(done.stdout)


def test_lang_chooses_the_help_language_where_a_command_has_it() -> None:
    chinese = trainguard("diagnose", "--lang", "zh", "--help", LANG="C")
    assert chinese.returncode == 0 and chinese.stdout.startswith("用法：trainguard diagnose "), chinese
    english = trainguard("doctor", "--lang=en", "--help", LANG="zh_CN.UTF-8")
    assert english.returncode == 0 and english.stdout.startswith("Usage: trainguard doctor "), english
    assert not WIDE.search(english.stdout)
    # A job's own --lang, after --, is not trainguard's.
    job = trainguard("run", "--help", "--", "python", "train.py", "--lang", "zh", LANG="C")
    assert job.returncode == 0 and job.stdout.startswith("Usage: trainguard run "), job
