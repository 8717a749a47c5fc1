"""Under a Chinese locale every message trainguard writes for a person is Chinese: each command is run
for real (with runs that failed, stopped and were continued) and its output is searched for English
sentences. Identifiers, paths, commands, units and what trainguard quotes (log lines, a library's own
words, in 「」 or backticks) are not sentences."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.runs import run_id_from, script, wait_for

pytestmark = pytest.mark.real

# Three English words in a row (two letters or more each) make a sentence; one or two are a name.
_SENTENCE = re.compile(r"[A-Za-z]{2,}(?:[ ,;'-]+[A-Za-z]{2,}){2,}")
_NOT_PROSE = [
    re.compile(r"「[^」]*」"),  # quoted: a log line, a library's message
    re.compile(r'"[^"]*"'),  # an error message as it is printed
    re.compile(r"`[^`]*`"),  # a command to type
    re.compile(r"https?://\S+"),
    re.compile(r"(?<![\w])[~.]?/[^\s，。；：）)」]*"),  # paths
    re.compile(r"--?[a-z][\w-]*(?:[ =][^\s，。；）)]+)?"),  # options and their values
    re.compile(r"\b[\w.-]*[_=][\w.=-]*\b"),  # identifiers: cause ids, VAR=value, snake_case
    re.compile(r"\btrainguard [a-z]+(?: [^\s，。；）)]+)*"),  # trainguard commands shown to type
]


def english_sentences(text: str, quoted: tuple[str, ...] = ()) -> list[str]:
    # What the job printed, shown as evidence (a terminal shows the start of a long line); longest
    # first, and never a short line that could cut words out of others.
    for line in sorted((q for q in quoted if len(q) >= 12), key=len, reverse=True):
        text = text.replace(line, "").replace(line[:200], "")
    for pattern in _NOT_PROSE:
        text = pattern.sub(" ", text)
    return _SENTENCE.findall(text)


def zh(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINGUARD_HOME": str(home), "LANG": "zh_CN.UTF-8", "LC_ALL": "zh_CN.UTF-8"}
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True, env=env,
                          timeout=180, check=False, input=stdin)  # fmt: skip


def test_the_checker_finds_english_sentences_and_lets_names_and_quotes_through() -> None:
    assert english_sentences("运行失败：the job died of a bug") == ["the job died of"]
    assert english_sentences("会话：本地会话；NVIDIA 驱动 550，CUDA 12.4，GPU 0") == []
    assert english_sentences("原因 host_oom（0.60）；日志：/tmp/x/attempt-1.log；用 `trainguard restart vit` 继续") == []
    assert english_sentences("NVML 报错：「Driver Not Loaded at all」") == []


def test_every_command_speaks_chinese_to_a_person(tmp_path: Path) -> None:
    home = tmp_path / "state"
    buggy = script(tmp_path, "buggy.py", 'import trainguard\nprint("step 0", flush=True)\nprint({"cat": 0}["bird"])\n')
    ticker = script(tmp_path, "ticker.py", "import time\nfor i in range(10**6):\n    print(i, flush=True)\n    time.sleep(0.1)\n")
    outputs: dict[str, subprocess.CompletedProcess] = {}
    outputs["run --foreground (a bug)"] = zh(home, "run", "--foreground", "--name", "bug", "--", sys.executable, buggy)
    started = zh(home, "run", "--name", "tick", "--", sys.executable, ticker)
    outputs["run (detached)"] = started
    run_id = started.stdout.split("运行 ", 1)[1].split("（", 1)[0] if "运行 " in started.stdout else run_id_from(started.stdout)
    wait_for(lambda: zh(home, "status", run_id, "--json").returncode == 0, what="the run")
    for name, args in {
        "ps": ["ps"],
        "status (running)": ["status", "tick"],
        "stop": ["stop", "tick", "--grace", "2s"],
        "status (stopped)": ["status", "tick"],
        "restart": ["restart", "tick"],
        "adopt (a watched run)": ["adopt", "tick"],
        "status (failed)": ["status", "bug"],
        "logs": ["logs", "bug"],
        "diagnose RUN": ["diagnose", "bug"],
        "diagnose --example": ["diagnose", "--example"],
        "doctor": ["doctor"],
        "demo": ["demo", "--scenario", "python_error"],
        "report": ["report", "bug"],
        "error: unknown option": ["run", "--bogus", "--", "true"],
        "error: no such run": ["status", "nosuch"],
        "error: no such file": ["diagnose", str(tmp_path / "missing.log")],
        "error: bad value": ["run", "--restart", "sometimes", "--", "true"],
        "error: no --": ["run", "python", "x.py"],
    }.items():
        outputs[name] = zh(home, *args)
    zh(home, "stop", "tick", "--grace", "1s")

    job_lines = [line for line in (tmp_path / "state").rglob("attempt-*.log") for line in line.read_text().splitlines()
                 if not line.startswith("==== trainguard")]  # fmt: skip
    evidence = [e["text"] for e in json.loads(zh(home, "diagnose", "bug", "--json").stdout)["evidence"]]
    example = [e["text"] for e in json.loads(zh(home, "diagnose", "--example", "--json").stdout)["evidence"]]
    quoted = tuple(job_lines + evidence + example + [buggy, ticker, sys.executable])
    found = {}
    for name, done in outputs.items():
        sentences = english_sentences(done.stdout + done.stderr, quoted)
        if sentences:
            found[name] = sentences
    assert not found, found
