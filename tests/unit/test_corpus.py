"""Accuracy on real crash logs from public issue threads (../shared/corpus), labelled by root cause."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import load_corpus
from trainguard.diagnosis.evidence import ExitStatus
from trainguard.diagnosis.scan import Scanner
from trainguard.diagnosis.signatures import default_table
from trainguard.postmortem import LogSource, investigate


def _diagnose(row: dict, scanner: Scanner) -> str:
    status = ExitStatus.from_number(row["exit_code"]) if row["exit_code"] is not None else None
    report = investigate([LogSource(None, [row["text"].encode()])], exit_status=status, scanner=scanner)
    return report.diagnosis.cause


@pytest.mark.parametrize("engine", ["hyperscan", "re"])
def test_accuracy_on_real_crash_logs_is_at_least_95_percent(engine: str) -> None:
    rows = load_corpus()
    scanner = Scanner(default_table().signatures, engine=engine)
    misses = {row["id"]: _diagnose(row, scanner) for row in rows if _diagnose(row, scanner) != row["label"]}
    accuracy = 1 - len(misses) / len(rows)
    assert accuracy >= 0.95, f"accuracy {accuracy:.1%}; misclassified: {misses}"


def test_every_label_in_the_corpus_is_recognised_at_least_once() -> None:
    rows = load_corpus()
    scanner = Scanner(default_table().signatures)
    hits = Counter(row["label"] for row in rows if _diagnose(row, scanner) == row["label"])
    assert set(hits) == {row["label"] for row in rows}
