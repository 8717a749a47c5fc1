"""A name or a log line cannot drive the terminal: run names holding ESC, BEL or U+202E are refused,
and what reaches the terminal from a record or a log (names stored before, commands, quoted log
lines) has its control characters written out. `logs`, like `cat`, passes the raw file through."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.runs import run_id_from, status, tg, wait_for

RAW = ("\x1b", "\x07", "\u202e")


@pytest.mark.parametrize("name", ["\x1b]0;pwned\x07", "bell\x07", "evil\u202etxt.exe", "tab\tname", "   "])
def test_a_name_with_control_characters_is_refused(name: str) -> None:
    done = tg("run", "--name", name, "--", "true")
    assert done.returncode == 2, done.stdout
    assert len(done.stderr.strip().splitlines()) == 1
    assert not any(c in done.stderr for c in RAW)
    assert tg("ps", "--json").stdout.strip() in ("", "[]")


def test_a_name_no_record_can_hold_or_that_would_reach_another_run_is_refused(tmp_path: Path, home: Path) -> None:
    # Bytes that are not UTF-8 reach Python as surrogates: they were a traceback from the registry.
    for name, why in ((b"n\xff", "not valid UTF-8"), (b"59a16d9f", "looks like a run id")):
        done = subprocess.run([sys.executable, "-m", "trainguard", "run", "--name", name, "--", "true"],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 2 and why in done.stderr and "Traceback" not in done.stderr, done.stderr
    folder = tmp_path / os.fsdecode(b"d\xff")
    folder.mkdir()
    done = subprocess.run([sys.executable, "-m", "trainguard", "run", "--", "true"], cwd=folder,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and "not valid UTF-8" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert tg("ps", "--json").stdout.strip() in ("", "[]")


def test_the_commands_a_run_is_told_to_type_work_as_typed(home: Path) -> None:
    started = tg("run", "--name", "a b", "--", "true")
    assert started.returncode == 0, started.stderr
    hint = next(line for line in started.stdout.splitlines() if "follow:" in line).split("follow:")[1].split()
    assert hint[:2] == ["trainguard", "logs"] and hint[3] == "-f" and len(hint) == 4, hint  # the id, not "a b"
    assert tg(*hint[1:3]).returncode == 0


def test_a_stored_name_and_command_reach_ps_and_status_written_out(home: Path) -> None:
    run_id = run_id_from(tg("run", "--name", "plain", "--", "sh", "-c", "echo '\x1b]0;title\x07'").stdout)
    wait_for(lambda: status(run_id)["state"] == "succeeded", what="the run to end")
    with sqlite3.connect(home / "runs.sqlite") as db:  # a name recorded before names were checked
        db.execute("UPDATE runs SET name = ? WHERE id = ?", ("\x1b]0;pwned\x07", run_id))
    for command in (["ps"], ["status", run_id]):
        shown = tg(*command).stdout
        assert not any(c in shown for c in RAW), repr(shown)
        assert "\\x1b]0;pwned\\x07" in shown


def test_a_log_line_quoted_by_diagnose_is_written_out(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"step 1\n\x1b]0;x\x07RuntimeError: CUDA error: an illegal memory access was encountered\n")
    done = tg("diagnose", str(log))
    assert done.returncode == 0, done.stderr
    assert "cuda_illegal_access" in done.stdout
    assert not any(c in done.stdout for c in RAW), repr(done.stdout)


def test_logs_passes_the_raw_file_through(tmp_path: Path) -> None:
    run_id = run_id_from(tg("run", "--", sys.executable, "-c", "print('\\x1b[1mbold\\x1b[0m')").stdout)
    wait_for(lambda: status(run_id)["state"] == "succeeded", what="the run to end")
    assert "\x1b[1mbold" in tg("logs", run_id).stdout
