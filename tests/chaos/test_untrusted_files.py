"""What the job writes cannot break its supervisor: a progress file or error file of nested JSON that
overflows the parser, a FIFO nobody writes in place of the progress file, fields of the wrong kind,
a huge sparse error file. Each was a real failure or wedge of the supervisor (issue 19, item 1)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.real.runs import run_id_from, script, status, tg, wait_for


def _run(tmp_path: Path, body: str, *extra: str) -> str:
    job = script(tmp_path, "job.py", body)
    started = tg("run", "--max-restarts", "0", *extra, "--", sys.executable, job)
    assert started.returncode == 0, started.stderr
    return run_id_from(started.stdout)


def test_nested_json_in_the_progress_file_does_not_kill_the_supervisor(tmp_path: Path) -> None:
    run_id = _run(tmp_path, """
        import os, time
        open(os.environ["TRAINGUARD_PROGRESS_FILE"], "w").write("[" * 200000)
        print("wrote it", flush=True)
        time.sleep(60)
    """)  # fmt: skip
    wait_for(lambda: "wrote it" in tg("logs", run_id).stdout, what="the job to write its progress file")
    time.sleep(4)  # several supervisor ticks read the file
    info = status(run_id)
    assert info["supervisor"] == "alive", info
    assert info["state"] == "running"
    assert tg("stop", run_id, "--grace", "2s").returncode == 0
    assert status(run_id)["state"] == "stopped"


def test_nested_json_in_the_error_file_still_gets_a_diagnosis(tmp_path: Path) -> None:
    run_id = _run(tmp_path, """
        import os
        open(os.environ["TRAINGUARD_ERROR_FILE"], "w").write("{\\"a\\":" * 100000)
        raise KeyError("bird")
    """)  # fmt: skip
    wait_for(lambda: status(run_id)["state"] == "failed", timeout=30, what="the run to end")
    attempt = status(run_id)["attempts"][0]
    assert attempt["cause"] == "python_error", attempt  # judged from the log; the error file ignored


def test_a_fifo_as_progress_file_does_not_wedge_the_supervisor(tmp_path: Path) -> None:
    run_id = _run(tmp_path, """
        import os, time
        path = os.environ["TRAINGUARD_PROGRESS_FILE"]
        os.mkfifo(path)
        os.mkfifo(os.environ["TRAINGUARD_ERROR_FILE"])
        print("made fifos", flush=True)
        time.sleep(3)
        raise SystemExit(3)
    """)  # fmt: skip
    wait_for(lambda: status(run_id)["state"] == "failed", timeout=30, what="the run to end despite the FIFOs")
    info = status(run_id)
    assert info["attempts"][0]["exit_code"] == 3


def test_progress_fields_of_the_wrong_kind_are_ignored_not_fatal(tmp_path: Path) -> None:
    run_id = _run(tmp_path, """
        import json, os, time
        record = {"step": "many", "step_time": [1], "saves": [["x", None, 3]], "stop_signal": {"a": 1},
                  "first_step": 5, "first_step_time": time.time()}
        open(os.environ["TRAINGUARD_PROGRESS_FILE"], "w").write(json.dumps(record))
        print("wrote it", flush=True)
        time.sleep(60)
    """)  # fmt: skip
    wait_for(lambda: "wrote it" in tg("logs", run_id).stdout, what="the job to write its progress file")
    time.sleep(4)
    info = status(run_id)
    assert info["supervisor"] == "alive", info
    assert tg("stop", run_id, "--grace", "2s").returncode == 0
    assert status(run_id)["state"] == "stopped"


def test_a_huge_sparse_error_file_is_not_read_whole(tmp_path: Path) -> None:
    run_id = _run(tmp_path, """
        import os
        with open(os.environ["TRAINGUARD_ERROR_FILE"], "wb") as out:
            out.truncate(64 * 1024 ** 3)  # 64 GiB of nothing: reading it whole would take the machine
        raise KeyError("bird")
    """)  # fmt: skip
    wait_for(lambda: status(run_id)["state"] == "failed", timeout=30, what="the run to end")
    assert status(run_id)["attempts"][0]["cause"] == "python_error"
