"""docs/accuracy.md and docs/accuracy.zh-CN.md are what tools/gen_accuracy.py writes from the corpus and
the engine now, and the figures of tools/accuracy.py count what they say on a set made by hand."""

from __future__ import annotations

from tests.conftest import ROOT
from tools.accuracy import Action, Judged, against_targets, judge, policy_action
from tools.gen_accuracy import pages
from trainguard.causes import CAUSE_IDS, catalogue

# A hand-made restart policy, so that the counting is tested apart from the catalogue's.
RESTARTED = {"cuda_oom", "host_oom", "nccl_failure", "preempted"}


def by_hand(cause: str, confidence: float) -> Action:
    if cause in RESTARTED:
        return Action.RESTART
    return Action.ONCE if cause == "unknown" else Action.END

ROWS = [
    Judged("right", "cuda_oom", "cuda_oom", 0.95),
    Judged("both-retried", "cuda_oom", "host_oom", 0.9),
    Judged("neither-retried", "python_error", "bad_command", 0.6),
    Judged("run-ended", "host_oom", "shm_exhausted", 0.4),
    Judged("restarted-on-unknown", "python_error", "unknown", 0.0),
    Judged("restarted-on-a-bug", "bad_command", "nccl_failure", 0.85),
    Judged("right-hesitant", "preempted", "preempted", 0.3),
    Judged("right-at-the-edge", "disk_full", "disk_full", 0.8),
]


def test_the_accuracy_pages_are_what_the_corpus_gives_now() -> None:
    for path, text in pages().items():
        assert (ROOT / path).read_text(encoding="utf-8") == text, f"{path} is out of date: python -m tools.gen_accuracy"


def test_costly_mistakes_are_the_wrong_names_that_change_the_restart_decision() -> None:
    figures = judge(ROWS, by_hand, CAUSE_IDS)
    assert [row.id for row in figures.stopped_wrongly] == ["run-ended"]
    assert [row.id for row in figures.restarted_wrongly] == ["restarted-on-a-bug"]
    assert [row.id for row in figures.restarted_once] == ["restarted-on-unknown"]  # one attempt, not a loop
    assert figures.costly == 2
    assert figures.fraction("costly_share") == (2, 8)


def test_accuracy_coverage_calibration_and_per_cause_figures() -> None:
    figures = judge(ROWS, by_hand, CAUSE_IDS)
    assert (figures.right, figures.logs) == (3, 8)
    assert figures.fraction("coverage") == (4, 8)
    assert figures.fraction("confident_precision") == (2, 4)
    assert [(band.low, band.logs, band.right) for band in figures.bands] == [
        (0.0, 1, 0), (0.25, 2, 1), (0.5, 1, 0), (0.8, 2, 1), (0.9, 2, 1),
    ]  # fmt: skip
    by_cause = {c.cause: (c.logs, c.called, c.right) for c in figures.causes}
    assert by_cause["cuda_oom"] == (2, 1, 1)
    assert by_cause["unknown"] == (0, 1, 0)
    assert [c.cause for c in figures.causes][:2] == ["cuda_oom", "host_oom"]  # the catalogue's order
    met = {target.figure: target.met for target in against_targets(figures)}
    assert met == {"confident_precision": False, "coverage": False, "accuracy": False, "costly_share": False}


def test_a_target_is_met_at_its_goal() -> None:
    rows = [Judged(str(n), "cuda_oom", "cuda_oom", 0.9) for n in range(49)]
    rows.append(Judged("run-ended", "cuda_oom", "python_error", 0.9))
    figures = judge(rows, by_hand, CAUSE_IDS)
    targets = against_targets(figures)
    measured = {target.figure: target.measured for target in targets}
    assert measured == {"confident_precision": 0.98, "coverage": 1.0, "accuracy": 0.98, "costly_share": 0.02}
    met = {target.figure: target.met for target in targets}
    assert met == {"confident_precision": True, "coverage": True, "accuracy": True, "costly_share": True}


def test_what_a_death_is_judged_to_cost_is_what_the_supervisor_does() -> None:
    action = policy_action(catalogue())
    assert {c: action(c, 0.9) for c in ("cuda_oom", "host_oom", "preempted")} == dict.fromkeys(
        ("cuda_oom", "host_oom", "preempted"), Action.RESTART)  # fmt: skip
    assert action("segfault", 0.9) is action("unknown", 0.0) is Action.ONCE
    for ends in ("python_error", "bad_command", "cuda_driver_mismatch", "shm_exhausted", "disk_full"):
        assert action(ends, 0.9) is Action.END, ends
        assert action(ends, 0.3) is Action.ONCE, ends  # too unsure to end a run on
    # An unsure python_error on a host OOM is one restart, not a run ended.
    figures = judge([Judged("unsure", "host_oom", "python_error", 0.3)], action, CAUSE_IDS)
    assert not figures.stopped_wrongly and not figures.restarted_once and figures.costly == 0
