"""`trainguard diagnose` on a log it cannot decide: a short "To decide it" section (and `next_steps`
in --json) says what to look at next, and stops asking for what --exit-code and --kernel-log gave."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import load_corpus
from tests.unit.test_cli_diagnose import OOM_LINE, run

# A real log that ends without an error (DeepSpeed's last warnings before it hung).
SILENT_LOG = next(row["text"] for row in load_corpus("dev") if row["id"] == "hang-B-10")
KERNEL_LOG = "[Mon Jun  1 02:40:00 2023] EXT4-fs (sda1): mounted filesystem with ordered data mode\n"


def test_an_unknown_log_says_what_to_look_at_next(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(SILENT_LOG)
    human = run(str(log)).stdout.decode()
    assert "No evidence decides the cause" in human
    section = human[human.index("To decide it") :]
    assert "--exit-code N" in section and "--kernel-log auto" in section and "sacct" in section
    found = json.loads(run(str(log), "--json").stdout)
    assert found["cause"] == "unknown"
    steps = found["next_steps"]
    assert all(isinstance(step, str) for step in steps)
    assert "--exit-code N" in steps[0] and any("--kernel-log auto" in step for step in steps)
    zh = run(str(log), "--lang", "zh").stdout.decode()
    assert "如何确定原因" in zh and "退出状态" in zh


def test_what_the_flags_gave_is_no_longer_asked_for(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(SILENT_LOG)
    kern = tmp_path / "kern.log"
    kern.write_text(KERNEL_LOG)
    found = json.loads(run(str(log), "--json", "--exit-code", "137", "--kernel-log", str(kern)).stdout)
    steps = found.get("next_steps", [])
    assert not any("--exit-code N" in step for step in steps)
    assert not any("--kernel-log auto" in step for step in steps)
    human = run(str(log), "--exit-code", "137", "--kernel-log", str(kern)).stdout.decode()
    section = human[human.index("To decide it") : human.index("scanned")]  # a SIGKILL: who sent it?
    assert "sacct" in section and "--exit-code" not in section and "--kernel-log" not in section


def test_a_decided_answer_has_no_such_section(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(OOM_LINE)
    assert "To decide it" not in run(str(log)).stdout.decode()
    assert "next_steps" not in json.loads(run(str(log), "--json").stdout)
