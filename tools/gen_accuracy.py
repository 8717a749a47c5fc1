"""Write docs/accuracy.md and docs/accuracy.zh-CN.md: how often the diagnosis is right on the labelled
corpus of real crash logs (tests/corpus), held-out and tuning parts, against the targets of issue 22.
Run it from the repository root whenever the signatures, the classifier, the catalogue or the corpus
change (tests/unit/test_accuracy_doc.py fails until it is run):

    python -m tools.gen_accuracy
"""

from __future__ import annotations

from tests.conftest import ROOT, load_corpus
from tools.accuracy import Judged, judge, policy_action
from tools.accuracy_page import PAGES, render
from trainguard.causes import CAUSE_IDS, catalogue
from trainguard.diagnosis.evidence import ExitStatus
from trainguard.diagnosis.scan import Scanner
from trainguard.diagnosis.signatures import default_table
from trainguard.postmortem import LogSource, investigate

PARTS = ("holdout", "dev")


def judged(row: dict, scanner: Scanner) -> Judged:
    """One corpus log diagnosed as `diagnose FILE` and tests/unit/test_corpus.py do: its text (all there
    is of the job) and its exit status."""
    status = ExitStatus.from_number(row["exit_code"]) if row["exit_code"] is not None else None
    source = LogSource(None, [row["text"].encode()])
    diagnosis = investigate([source], exit_status=status, scanner=scanner, logs_are_all=True).diagnosis
    return Judged(row["id"], row["label"], diagnosis.cause, diagnosis.confidence)


def pages() -> dict[str, str]:
    """The pages' text by path relative to the repository root."""
    action = policy_action(catalogue())
    scanner = Scanner(default_table().signatures)
    parts = {part: judge([judged(row, scanner) for row in load_corpus(part)], action, CAUSE_IDS) for part in PARTS}
    return {path: render(parts, action, CAUSE_IDS, lang) for lang, path in PAGES.items()}


def main() -> None:
    for path, text in pages().items():
        target = ROOT / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
