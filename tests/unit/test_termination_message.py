"""The verdict a pod's termination message carries (Kubernetes keeps 4096 bytes of it): pure, on the
diagnosis shapes the supervisor records."""

from __future__ import annotations

import json

import pytest

from trainguard.causes import catalogue
from trainguard.integrations.kubernetes import MAX_BYTES, deciding_evidence, termination_message

CAUSES = catalogue()

# As `status --json` records an attempt killed in its memory cgroup (a real run's diagnosis).
HOST_OOM = {
    "cause": "host_oom",
    "confidence": 0.99,
    "evidence": [
        {"source": "log", "line": 412, "text": "Killed"},
        {"source": "kernel", "line": None,
         "text": "Memory cgroup out of memory: Killed process 31337 (python) total-vm:82132kB, anon-rss:65152kB"},
        {"source": "exit", "line": None, "text": "killed by signal 9 (SIGKILL)"},
    ],
}  # fmt: skip
PYTHON_ERROR = {
    "cause": "python_error",
    "confidence": 0.804,
    "evidence": [
        {"source": "log", "line": 2, "text": "Traceback (most recent call last):"},
        {"source": "log", "line": 6, "text": "KeyError: 'bird'"},
        {"source": "log", "line": 1, "text": "KeyError: 'bird'", "file": "error file"},
        {"source": "exit", "line": None, "text": "exit code 1"},
    ],
}


def _message(**overrides) -> dict:
    values = {"run_id": "ab12cd34", "state": "failed", "exit_code": 75, "attempts": 3, "diagnosis": HOST_OOM,
              "reason": "host_oom after 2 restarts", "catalogue": CAUSES}  # fmt: skip
    values.update(overrides)
    text = termination_message(**values)
    assert len(text.encode()) <= MAX_BYTES
    return json.loads(text)


def test_the_message_carries_cause_confidence_title_deciding_line_and_first_fix() -> None:
    message = _message()
    assert message["exit_code"] == 75 and message["state"] == "failed" and message["run"] == "ab12cd34"
    assert message["cause"] == "host_oom" and message["confidence"] == 0.99
    assert message["title"] == CAUSES["host_oom"].title["en"]
    assert message["evidence"].startswith("kernel: Memory cgroup out of memory: Killed process 31337")
    assert message["fix"] == CAUSES["host_oom"].fixes["en"][0]


def test_the_deciding_line_is_the_last_one_that_is_not_the_bare_exit_status() -> None:
    assert deciding_evidence(PYTHON_ERROR["evidence"]) == "error file line 1: KeyError: 'bird'"
    assert deciding_evidence(PYTHON_ERROR["evidence"][:2]) == "log line 6: KeyError: 'bird'"
    assert deciding_evidence([{"source": "exit", "line": None, "text": "exit code 3"}]) == "exit: exit code 3"
    assert deciding_evidence([]) is None


def test_chinese_titles_and_fixes() -> None:
    message = _message(lang="zh")
    assert message["title"] == CAUSES["host_oom"].title["zh"] and message["fix"] == CAUSES["host_oom"].fixes["zh"][0]


def test_a_stop_from_outside_reads_as_preempted_and_a_success_as_succeeded() -> None:
    stopped = _message(state="stopped", exit_code=75, diagnosis=None, reason="stopped on request")
    assert stopped["cause"] == "preempted" and "outside trainguard" in stopped["evidence"]
    assert stopped["fix"] == CAUSES["preempted"].fixes["en"][0]
    done = _message(state="succeeded", exit_code=0, diagnosis=None, reason="exited 0")
    assert done["cause"] is None and done["title"] == "the run succeeded" and done["fix"] is None
    by_person = _message(state="stopped", exit_code=0, diagnosis=None, reason="stopped on request")
    assert by_person["cause"] is None and by_person["title"] == "stopped on request"


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: " + "x" * 1_000_000,  # a megabyte of one line (a tensor printed into an exception)
        "错误：" + "显存不足" * 200_000,  # multi-byte UTF-8: cut on a character boundary
        'ValueError: "' + '\\"' * 50_000,  # escapes cost more in JSON than in the text
        "\x01" * 10_000,  # control characters are six bytes each in JSON
    ],
)
def test_a_huge_evidence_line_is_cut_so_that_the_message_fits_4_kb(line: str) -> None:
    diagnosis = {"cause": "python_error", "confidence": 0.9, "evidence": [{"source": "log", "line": 7, "text": line}]}
    message = _message(diagnosis=diagnosis, exit_code=78, lang="zh")
    assert message["evidence"].startswith("log line 7: " + line[:8]) and message["evidence"].endswith("…")
    # everything else is whole
    assert message["cause"] == "python_error" and message["fix"] == CAUSES["python_error"].fixes["zh"][0]
    text = termination_message(run_id="r", state="failed", exit_code=78, attempts=1, diagnosis=diagnosis,
                               reason=None, catalogue=CAUSES, lang="zh")  # fmt: skip
    assert MAX_BYTES - 64 < len(text.encode()) <= MAX_BYTES  # cut to fit, not cut to nothing


def test_a_short_message_is_not_cut() -> None:
    text = termination_message(run_id="r", state="failed", exit_code=78, attempts=1, diagnosis=PYTHON_ERROR,
                               reason=None, catalogue=CAUSES)  # fmt: skip
    assert "…" not in text and len(text.encode()) < 1024


def test_a_long_reason_is_shortened_with_the_evidence_line_not_instead_of_its_beginning() -> None:
    """The longest texts are cut first, each keeping its beginning: a 10 KB evidence line beside a
    long reason keeps its start, and cause, confidence, title and the (short) first fix stay whole."""
    line = "RuntimeError: shape mismatch " + "[1024, 1024] " * 800  # about 10 KB
    diagnosis = {"cause": "python_error", "confidence": 0.9, "evidence": [{"source": "log", "line": 7, "text": line}]}
    for reason in ("python_error: a restart cannot help; fix it first", "died: " + "a long account " * 400):
        message = _message(diagnosis=diagnosis, exit_code=78, reason=reason)
        assert message["cause"] == "python_error" and message["confidence"] == 0.9
        assert message["title"] == CAUSES["python_error"].title["en"]
        assert message["fix"] == CAUSES["python_error"].fixes["en"][0]
        assert message["evidence"].startswith("log line 7: RuntimeError: shape mismatch [1024, 1024]")
        assert message["evidence"].endswith("…") and len(message["evidence"]) > 1000
        assert message["reason"] == reason or (message["reason"].startswith("died: a long account") and
                                               message["reason"].endswith("…"))  # fmt: skip


def test_texts_shorter_than_the_cut_stay_whole_and_cut_ones_are_cut_alike() -> None:
    long_reason, long_line = "r" * 6000, "e" * 6000
    diagnosis = {"cause": "python_error", "confidence": 0.9, "evidence": [{"source": "log", "text": long_line}]}
    text = termination_message(run_id="r", state="failed", exit_code=78, attempts=1, diagnosis=diagnosis,
                               reason=long_reason, catalogue=CAUSES)  # fmt: skip
    message = json.loads(text)
    assert MAX_BYTES - 64 < len(text.encode()) <= MAX_BYTES
    assert abs(len(message["reason"]) - len(message["evidence"])) <= len("log: ") + 1
    assert message["fix"] == CAUSES["python_error"].fixes["en"][0]
