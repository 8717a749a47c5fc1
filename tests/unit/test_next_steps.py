"""What to look at next when a diagnosis does not decide (data/next_steps.toml): the pure choice of
steps, on real logs of tests/corpus that come out unknown or unsure, and the supervisor's autopsy,
which gathers the exit status and the kernel log itself and is never asked for them."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import load_corpus
from tests.run.test_chinese import english_sentences
from trainguard.diagnosis.classify import Diagnosis
from trainguard.diagnosis.evidence import ExitStatus, KernelLine
from trainguard.diagnosis.next_steps import Gathered, default_steps, next_steps, parse_steps
from trainguard.errors import DataError
from trainguard.postmortem import LogSource, Report, diagnosis_dict, investigate
from trainguard.probes import kernel_log
from trainguard.supervisor.autopsy import attempt_report

TABLE = default_steps()
CORPUS = {row["id"]: row for row in load_corpus("dev")}


def judged(log_id: str) -> Report:
    """A corpus log as `trainguard diagnose LOG` judges it (its exit status where the thread gives it)."""
    row = CORPUS[log_id]
    status = ExitStatus.from_number(row["exit_code"]) if row["exit_code"] is not None else None
    return investigate([LogSource(None, [row["text"].encode()])], exit_status=status, logs_are_all=True)


def step_ids(report: Report, **had: object) -> list[str]:
    gathered = replace(report.gathered, **had)
    return [step.id for step in next_steps(report.diagnosis, gathered, TABLE)]


def test_the_shipped_table_says_each_step_in_both_languages_with_its_source() -> None:
    assert 0 < TABLE.below_confidence <= 1 and TABLE.max_shown >= 3
    for step in TABLE.steps:
        assert step.source and step.text.en and step.when
        assert re.search(r"[\u4e00-\u9fff]", step.text.zh), step.id
        assert step.text.en.count("`") % 2 == 0 and step.text.zh.count("`") % 2 == 0, step.id
        assert english_sentences(step.text.zh) == [], step.id  # commands in backticks, prose in Chinese


def test_a_confident_answer_has_nothing_left_to_decide() -> None:
    report = judged("cuda_oom-7")  # the OutOfMemoryError line itself
    assert report.diagnosis.cause == "cuda_oom" and report.diagnosis.confidence >= TABLE.below_confidence
    assert report.next_steps == () and step_ids(report) == []
    assert "next_steps" not in diagnosis_dict(report.diagnosis, "en", steps=report.next_steps)


def test_a_log_that_ends_without_an_error_asks_for_the_exit_status_the_kernel_log_and_who_stopped_it() -> None:
    report = judged("hang-B-10")  # DeepSpeed's last warnings, then nothing: it hung
    assert report.diagnosis.cause == "unknown" and report.gathered.silent
    assert report.gathered.exit_status is False and report.gathered.kernel_log is False
    assert [s.id for s in report.next_steps][:3] == ["exit_status", "kernel_log", "who_stopped_it"]
    assert step_ids(report) == [s.id for s in report.next_steps]
    # Given both, they are no longer asked for; who stopped it is still the question.
    had_both = step_ids(report, exit_status=True, kernel_log=True)
    assert "exit_status" not in had_both and "kernel_log" not in had_both
    assert "who_stopped_it" in had_both


def test_a_sigkill_asks_for_the_kernel_log_and_the_cgroup_count_until_they_were_read() -> None:
    report = judged("host_oom-4")  # torchrun's "exitcode: -9", nothing else
    assert report.diagnosis.cause == "host_oom" and report.diagnosis.confidence < TABLE.below_confidence
    assert step_ids(report) == ["kernel_log", "memory_cgroup"]  # its exit status is known
    assert step_ids(report, oom_counters=True) == ["kernel_log"]
    assert step_ids(report, kernel_log=True) == []


def test_a_gpu_reading_asks_the_gpu_and_for_its_xid_lines() -> None:
    report = judged("gpu_hardware-C-8")  # ROCm's "Memory access fault by GPU node-1"
    readings = {report.diagnosis.cause, *(c for c, _ in report.diagnosis.alternatives)}
    assert readings >= {"cuda_illegal_access", "gpu_hardware"}
    ids = step_ids(report)
    assert "gpu_state" in ids and "gpu_xid" in ids
    with_kernel = step_ids(report, kernel_log=True)
    assert "gpu_state" in with_kernel and "gpu_xid" not in with_kernel


def test_several_ranks_in_one_log_ask_for_every_ranks_log() -> None:
    report = judged("python_error-r4e-6")  # LLaMA-Factory: [rank3] and [rank6] tracebacks in one file
    assert report.gathered.ranks == {3, 6} and report.gathered.logs == 1
    assert "rank_logs" in step_ids(report)
    assert "rank_logs" not in step_ids(report, logs=2)


def test_a_collective_timeout_in_one_log_may_be_another_ranks_failure_or_a_hang() -> None:
    report = judged("nccl_failure-12")  # the NCCL watchdog's line alone
    assert report.diagnosis.cause == "nccl_failure" and ("hang", 0.4) in report.diagnosis.alternatives
    ids = step_ids(report)
    assert {"exit_status", "still_running", "rank_logs", "nccl_debug"} <= set(ids)
    assert "still_running" not in step_ids(report, exit_status=True)  # someone saw it end


def test_the_confidence_line_and_the_most_shown() -> None:
    report = judged("nccl_failure-12")
    at_the_line = replace(report.diagnosis, confidence=TABLE.below_confidence)
    just_below = replace(report.diagnosis, confidence=TABLE.below_confidence - 0.01)
    assert next_steps(at_the_line, report.gathered, TABLE) == ()
    assert next_steps(just_below, report.gathered, TABLE)
    unknown = Diagnosis("unknown", 0.0, (), (("hang", 0.2), ("gpu_hardware", 0.1), ("nccl_failure", 0.1)))
    shown = next_steps(unknown, Gathered(silent=True), TABLE)
    assert len(shown) == TABLE.max_shown
    assert [s.id for s in shown] == [s.id for s in TABLE.steps if s in shown]  # in the table's order


def test_the_json_carries_the_steps_in_the_readers_language() -> None:
    report = judged("hang-B-10")
    en = diagnosis_dict(report.diagnosis, "en", steps=report.next_steps)["next_steps"]
    zh = diagnosis_dict(report.diagnosis, "zh", steps=report.next_steps)["next_steps"]
    assert len(en) == len(zh) == len(report.next_steps)
    assert "--exit-code N" in en[0] and "退出状态" in zh[0]


@pytest.mark.parametrize(
    "step",
    [
        {"id": "x", "when": [{"exit_status": "no"}], "source": "s", "en": "e", "zh": "中"},
        {"id": "x", "when": [{"weather": True}], "source": "s", "en": "e", "zh": "中"},
        {"id": "x", "when": [{"causes": ["cuda_oom", "gremlins"]}], "source": "s", "en": "e", "zh": "中"},
        {"id": "x", "when": [{}], "source": "s", "en": "e", "zh": "中"},
        {"id": "x", "when": [{"silent": True}], "en": "e", "zh": "中"},
    ],
)
def test_a_malformed_step_is_refused(step: dict) -> None:
    with pytest.raises(DataError):
        parse_steps({"below_confidence": 0.8, "max_shown": 4, "step": [step]})


def test_inside_run_the_autopsy_never_asks_for_the_exit_status_or_kernel_log_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "attempt-1.log"
    log.write_text(CORPUS["hang-B-10"]["text"])
    quiet = [KernelLine(time=1000.0, text="EXT4-fs (sda1): mounted filesystem")]
    monkeypatch.setattr(kernel_log, "read_live", lambda: (quiet, "test"))
    report = attempt_report(str(log), log_start=0, log_end=None, exit_status=ExitStatus(signal=9),
                            started=900.0, ended=1010.0, pids={4242}, error_file=None)  # fmt: skip
    assert report.gathered.exit_status and report.gathered.kernel_log
    # A SIGKILL with no OOM kill in a readable kernel log: someone sent it.
    assert report.diagnosis.cause == "killed" and report.diagnosis.confidence < TABLE.below_confidence
    ids = [s.id for s in report.next_steps]
    assert ids == ["who_stopped_it"]
