"""The signature table is data: every row loads, compiles in both engines and matches its examples."""

from __future__ import annotations

import pytest

from trainguard.causes import CAUSE_IDS, catalogue
from trainguard.diagnosis.scan import Scanner
from trainguard.diagnosis.signatures import XID_CAUSE, Role, default_table, lookup_xid, parse_table
from trainguard.errors import DataError

TABLE = default_table()


@pytest.mark.parametrize("signature", TABLE.signatures, ids=lambda s: s.id)
def test_each_signature_matches_its_real_examples(signature) -> None:
    assert signature.examples, f"{signature.id} has no example line"
    scanner = Scanner([signature])
    for example in signature.examples:
        assert signature.regex.search(example.encode()), example
        # and the fast engine agrees with Python's re on the same line
        assert scanner.scan_text(example + "\n").matches, f"hyperscan missed: {example}"


@pytest.mark.parametrize("signature", TABLE.signatures, ids=lambda s: s.id)
def test_each_signature_names_a_cause_and_a_source(signature) -> None:
    assert signature.cause in CAUSE_IDS or signature.cause == XID_CAUSE
    assert signature.source.strip()
    assert signature.role is Role.WRAPPER or signature.weight > 0 or signature.cause == XID_CAUSE or signature.rereads


def test_catalogue_has_every_cause_with_english_and_chinese_fixes() -> None:
    causes = catalogue()
    assert tuple(causes) == CAUSE_IDS
    for cause in causes.values():
        assert cause.title["en"] and cause.title["zh"]
        assert len(cause.fixes["en"]) == len(cause.fixes["zh"]) >= 1, cause.id


def test_retry_defaults_follow_the_design() -> None:
    expected = {
        "cuda_oom": "yes",
        "host_oom": "yes",
        "shm_exhausted": "no",
        "cuda_driver_mismatch": "no",
        "cuda_illegal_access": "once",
        "gpu_hardware": "yes",
        "nccl_failure": "yes",
        "sighup": "yes",
        "preempted": "yes",
        "disk_full": "no",
        "too_many_open_files": "no",
        "segfault": "once",
        "python_error": "no",
        "hang": "yes",
        "node_reboot": "yes",
        "killed": "yes",
        "peer_failure": "yes",
        "bad_command": "no",
        "memory_leak": "yes",
        "unknown": "once",
    }
    assert {c.id: c.retry.value for c in catalogue().values()} == expected
    assert catalogue()["cuda_oom"].batch_scale == 0.5
    assert catalogue()["gpu_hardware"].retry_pause_s > 0


def test_xid_table_maps_catalogue_codes_and_unknown_ones() -> None:
    assert lookup_xid(79).cause == "gpu_hardware" and lookup_xid(79).weight >= 0.9
    assert lookup_xid(48).cause == "gpu_hardware"
    assert lookup_xid(13).cause == "cuda_illegal_access"
    assert lookup_xid(45).weight < 0.25  # a consequence of a kill, not a cause
    assert lookup_xid(63).weight < 0.5  # informational: NVIDIA says no action needed
    unknown = lookup_xid(99999)
    assert unknown.xid == 99999 and unknown.cause == "gpu_hardware"


@pytest.mark.parametrize(
    ("pattern", "complaint"),
    [(r"foo\s+bar", r"\s"), (r"exit \d+", r"\d"), ("(?!x)y", "lookahead"), ("(unclosed", "bad pattern")],
)
def test_a_malformed_signature_row_is_refused_with_a_reason(pattern: str, complaint: str) -> None:
    row = {"id": "x", "cause": "cuda_oom", "pattern": pattern, "weight": 0.5, "role": "root", "source": "s"}
    with pytest.raises(DataError, match=complaint.replace("\\", "\\\\")):
        parse_table({"signature": [row]})


def test_unknown_cause_and_duplicate_ids_are_refused() -> None:
    row = {"id": "x", "cause": "bad", "pattern": "a", "weight": 0.5, "role": "root", "source": "s"}
    with pytest.raises(DataError, match="unknown cause"):
        parse_table({"signature": [row]})
    row["cause"] = "cuda_oom"
    with pytest.raises(DataError, match="duplicate"):
        parse_table({"signature": [row, dict(row)]})


def test_a_row_that_narrows_an_unknown_row_or_a_silent_end_of_an_unknown_cause_is_refused() -> None:
    row = {"id": "x", "cause": "cuda_oom", "pattern": "a", "weight": 0.5, "role": "root", "source": "s"}
    with pytest.raises(DataError, match="narrows unknown rows"):
        parse_table({"signature": [{**row, "narrows": ["nosuch"]}]})
    silent = {"readings": [["nosuch", 0.2]], "text": {"en": "e", "zh": "z"}, "note": {"en": "e", "zh": "z"},
              "source": "s"}  # fmt: skip
    with pytest.raises(DataError, match="unknown causes"):
        parse_table({"signature": [row], "silent_end": silent})
