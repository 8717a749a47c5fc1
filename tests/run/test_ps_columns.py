"""`trainguard ps` keeps its columns in view: a long run name is cut to 32 terminal columns (`status`
shows it whole), and columns align by terminal width, a Chinese character taking two (before: one
100-character name pushed LAST DEATH and COMMAND of every row off the screen, and Chinese names and
headers came out of line)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rich.cells import cell_len

from tests.conftest import trainguard_cmd

LONG = "sweep-lr3e-4-bs512-warmup2000-" + "x" * 70
CHINESE = "训练-中文名字很长很长很长很长很长很长很长很长"


def tg(home: Path, *args: str, lang: str = "C.UTF-8") -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINGUARD_HOME": str(home), "LANG": lang}
    env.pop("LC_ALL", None)
    return subprocess.run([*trainguard_cmd(), *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def command_column(line: str, command: str) -> int:
    """The terminal column where ``command`` starts in ``line``."""
    return cell_len(line[: line.rindex(command)])


def test_a_long_or_chinese_name_leaves_every_column_in_view(tmp_path: Path) -> None:
    home = tmp_path / "state"
    for name, word in ((LONG, "one"), (CHINESE, "two"), ("short", "three")):
        done = tg(home, "run", "--foreground", "--name", name, "--", "echo", word)
        assert done.returncode == 0, done.stderr
    for lang in ("C.UTF-8", "zh_CN.UTF-8"):
        lines = tg(home, "ps", lang=lang).stdout.splitlines()
        assert len(lines) == 4, lines
        starts = {command_column(line, command) for line, command in zip(lines, ("命令" if "zh" in lang else "COMMAND",
                                                                                   "echo three", "echo two", "echo one"))}  # fmt: skip
        assert len(starts) == 1, lines  # every row's COMMAND starts in the same column
        assert max(cell_len(line) for line in lines) < 32 + 60, lines
        assert any("sweep-lr3e-4-bs512-warmup2000-" in line and "…" in line for line in lines)
    shown = tg(home, "status", LONG).stdout
    assert f"({LONG})" in shown  # status names it whole
