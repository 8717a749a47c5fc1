"""The streaming scanner: line numbers across blocks, huge lines, bounded memory, engines agree."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from trainguard.diagnosis.scan import (
    BLOCK_SIZE,
    MAX_LINE,
    MAX_TEXT,
    MAX_WORKERS,
    PARALLEL_MIN_RANGE,
    LineMatch,
    LogFile,
    Scanner,
    ScanResult,
)
from trainguard.diagnosis.signatures import default_table

SIGNATURES = default_table().signatures


def small_blocks(data: bytes, size: int):
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("engine", ["hyperscan", "re"])
@pytest.mark.parametrize("block", [7, 64, 4096])
def test_line_numbers_are_exact_whatever_the_block_boundaries(engine: str, block: int) -> None:
    lines = [f"step {i} loss 0.{i}" for i in range(300)]
    lines[41] = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB"
    lines[250] = "OSError: [Errno 28] No space left on device"
    data = ("\n".join(lines) + "\n").encode()
    result = Scanner(SIGNATURES, engine=engine).scan(small_blocks(data, block))
    found = {(m.signature.id, m.line) for m in result.matches}
    assert ("cuda_oom_message", 42) in found
    assert ("enospc", 251) in found
    assert result.lines == 300
    assert result.bytes == len(data)


def test_a_log_without_final_newline_counts_its_last_line() -> None:
    result = Scanner(SIGNATURES).scan([b"a\nb\nKilled"])
    assert result.lines == 3
    assert [m.line for m in result.matches if m.signature.id == "shell_killed"] == [3]


def test_a_repeated_line_keeps_a_bounded_number_of_matches_and_the_last_one() -> None:
    line = b"[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)\n"
    result = Scanner(SIGNATURES).scan(small_blocks(line * 200_000, 1 << 20))
    kept = [m for m in result.matches if m.signature.id == "nccl_watchdog_timeout"]
    assert len(kept) <= 6
    assert kept[-1].line == 200_000


def test_a_huge_single_line_is_scanned_in_pieces_and_cut_for_display() -> None:
    huge = b"x" * (3 * 1024 * 1024) + b" CUDA out of memory. Tried to allocate 1 GiB " + b"y" * (3 * 1024 * 1024)
    result = Scanner(SIGNATURES).scan(small_blocks(huge, 1 << 20))
    match = next(m for m in result.matches if m.signature.id == "cuda_oom_message")
    assert match.line == 1
    assert len(match.text) <= MAX_TEXT + 1


def test_progress_bar_carriage_returns_show_the_last_screen_state() -> None:
    data = b"\r 10%|#  | 1/10\r 20%|## | 2/10\rRuntimeError: CUDA error: an illegal memory access was encountered\n"
    match = Scanner(SIGNATURES).scan([data]).matches[0]
    assert match.text == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_invalid_utf8_and_colour_codes_do_not_hide_a_failure() -> None:
    data = b"\xff\xfe garbage \xc3\x28\n\x1b[31mRuntimeError: CUDA out of memory. Tried to allocate\x1b[0m\n"
    match = next(m for m in Scanner(SIGNATURES).scan([data]).matches if m.signature.id == "cuda_oom_message")
    assert match.line == 2 and "\x1b" not in match.text


def test_engines_agree_on_a_mixed_log() -> None:
    text = "\n".join(sig_example for sig in SIGNATURES for sig_example in sig.examples) + "\n"
    fast = Scanner(SIGNATURES, engine="hyperscan").scan_text(text)
    slow = Scanner(SIGNATURES, engine="re").scan_text(text)
    assert {(m.signature.id, m.line) for m in fast.matches} == {(m.signature.id, m.line) for m in slow.matches}


def test_the_compiled_database_is_cached_and_a_damaged_cache_is_ignored(tmp_path) -> None:
    first = Scanner(SIGNATURES, cache_dir=tmp_path)
    cached = list(tmp_path.glob("signatures-*.hsdb"))
    assert first.engine == "hyperscan" and len(cached) == 1
    assert Scanner(SIGNATURES, cache_dir=tmp_path).scan_text("Killed\n").matches  # loads from the cache
    cached[0].write_bytes(cached[0].read_bytes()[:-100] + b"\0" * 100)  # a torn or tampered file
    again = Scanner(SIGNATURES, cache_dir=tmp_path)
    assert again.scan_text("RuntimeError: CUDA out of memory.\n").matches
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o500)
    assert Scanner(SIGNATURES, cache_dir=read_only / "sub").scan_text("Killed\n").matches


# --- A file scanned in several ranges at once (forked workers) gives exactly the serial result. ---

EXAMPLES = [example.encode() for sig in SIGNATURES for example in sig.examples]
OOM = b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB"
ENOSPC = b"OSError: [Errno 28] No space left on device"
SCANNER = Scanner(SIGNATURES)  # compiled once for the many files below


def filler(rng: random.Random, count: int, newline: bytes = b"\n") -> bytes:
    lines = []
    for step in range(count):
        kind = rng.random()
        if kind < 0.3:
            lines.append(b"\r".join(b" %d%%|%s| %d/100" % (p, b"#" * (p // 10), p) for p in range(0, 30, 3)))
        elif kind < 0.35:
            lines.append(b"gpu-node-07:1402:1405 [3] NCCL WARN NET/IB : Got async event : GID table change")
        else:
            lines.append(b"step=%d loss=%.4f lr=3e-4" % (step, rng.random()))
    return newline.join(lines) + newline


def serial(data: bytes, block: int = 1 << 20) -> list[LineMatch]:
    return SCANNER.scan(small_blocks(data, block)).matches


def in_ranges(
    tmp_path: Path, data: bytes, parts: int | None, monkeypatch: pytest.MonkeyPatch
) -> tuple[ScanResult, int]:
    """The file scanned in ``parts`` ranges, and how many worker processes were forked for it."""
    forks = []
    real_fork = os.fork

    def counting_fork() -> int:
        pid = real_fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counting_fork)
    path = tmp_path / "train.log"
    path.write_bytes(data)
    with path.open("rb") as handle:
        result = SCANNER.scan_file(handle, parts=parts)
    return result, len(forks)


def assert_same_as_serial(tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch, parts: int) -> None:
    expected = SCANNER.scan(small_blocks(data, 4093))
    result, forks = in_ranges(tmp_path, data, parts, monkeypatch)
    assert forks >= 1
    assert result.matches == expected.matches
    assert (result.lines, result.bytes) == (expected.lines, expected.bytes)


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])
@pytest.mark.parametrize("parts", [2, 3])
def test_matches_around_every_range_border_are_the_serial_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, newline: bytes, parts: int
) -> None:
    # Eight lines of one signature (more than the five kept) and others between them, after a head
    # of ordinary lines; a padding line after them sizes the file so that the first range border
    # (a size/parts, moved to the next line end) steps through every line of the middle.
    oom = b"CUDA out of memory"
    middle = newline.join([oom, b"Killed", oom, oom, b"Traceback (most recent call last):", oom, oom, oom, oom])
    head = filler(random.Random(parts), 60, newline)
    tail = filler(random.Random(7), 20, newline)
    end = newline + OOM + newline
    for border in range(len(head) - 10, len(head) + len(middle) + 10, 3):
        padding = parts * border - len(head) - len(middle) - len(newline) - len(tail) - len(end)
        data = head + middle + newline + tail + b"x" * padding + end
        assert len(data) == parts * border
        assert_same_as_serial(tmp_path, data, monkeypatch, parts)


@pytest.mark.parametrize("parts", [2, 4])
def test_a_generated_log_with_every_signature_is_scanned_the_same_in_ranges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parts: int
) -> None:
    rng = random.Random(11)
    lines = []
    for _ in range(4000):
        lines.append(rng.choice(EXAMPLES) if rng.random() < 0.2 else filler(rng, 1).rstrip(b"\n"))
    data = b"\n".join(lines)  # and no newline after the last line
    assert not data.endswith(b"\n")
    assert_same_as_serial(tmp_path, data, monkeypatch, parts)


@pytest.mark.parametrize("parts", [2, 3])
def test_huge_lines_are_cut_the_same_whatever_range_they_fall_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parts: int
) -> None:
    # Lines longer than MAX_LINE are scanned in pieces counted from their own start, so a match in
    # the second piece, or one right after a piece boundary, is found wherever the ranges begin.
    rng = random.Random(5)
    huge = bytearray(b"=" * (5 * MAX_LINE // 2))
    huge[10 : 10 + len(OOM)] = OOM
    huge[MAX_LINE + 3 : MAX_LINE + 3 + len(ENOSPC)] = ENOSPC  # only in the second piece
    huge[2 * MAX_LINE + 100 : 2 * MAX_LINE + 100 + len(OOM)] = OOM
    data = filler(rng, 5000) + bytes(huge) + b"\n" + filler(rng, 3000) + OOM + b"\n" + bytes(huge) + b"\r\n"
    assert_same_as_serial(tmp_path, data, monkeypatch, parts)
    found = [(m.signature.id, m.line) for m in serial(data) if m.signature.id in ("cuda_oom_message", "enospc")]
    assert found == [
        ("cuda_oom_message", 5001),
        ("enospc", 5001),
        ("cuda_oom_message", 8002),
        ("cuda_oom_message", 8003),
        ("enospc", 8003),
    ]


def test_a_file_smaller_than_a_block_split_in_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"step 1\n" + OOM + b"\nstep 2\r\nKilled\nstep 3\n" + OOM
    assert len(data) < BLOCK_SIZE
    for parts in (2, 3, 4):
        assert_same_as_serial(tmp_path, data, monkeypatch, parts)
    result, _ = in_ranges(tmp_path, data, 4, monkeypatch)
    assert [(m.signature.id, m.line) for m in result.matches if m.signature.id != "python_exception"] == [
        ("cuda_oom_message", 2),
        ("shell_killed", 4),
        ("cuda_oom_message", 6),
    ]


def test_a_worker_that_dies_has_its_range_scanned_by_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fork = os.fork

    def dying_fork() -> int:
        pid = real_fork()
        if pid == 0:
            os._exit(3)  # a child killed before it could report
        return pid

    monkeypatch.setattr(os, "fork", dying_fork)
    data = filler(random.Random(2), 3000) + OOM + b"\n" + filler(random.Random(3), 3000) + OOM + b"\n"
    path = tmp_path / "train.log"
    path.write_bytes(data)
    with path.open("rb") as handle:
        result = SCANNER.scan_file(handle, parts=3)
    assert result.matches == serial(data)
    assert [m.line for m in result.matches if m.signature.id == "cuda_oom_message"] == [3001, 6002]


def test_a_range_of_a_file_is_scanned_with_lines_counted_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"Killed\nstep 1\n" + OOM + b"\nstep 2\n")
    with path.open("rb") as handle:
        result = SCANNER.scan(LogFile(handle, start=7))
    assert [(m.signature.id, m.line) for m in result.matches] == [("cuda_oom_message", 2), ("python_exception", 2)]
    assert result.lines == 3


def test_a_large_file_is_split_across_the_usable_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one usable CPU: the scan stays in one process")
    line = b"step=1 loss=0.5 lr=3e-4 " + b"." * 100 + b"\n"
    data = line * (2 * PARALLEL_MIN_RANGE // len(line) + 1) + OOM + b"\n"
    result, forks = in_ranges(tmp_path, data, None, monkeypatch)
    assert forks == min(cpus, MAX_WORKERS, len(data) // PARALLEL_MIN_RANGE) - 1
    assert [m.line for m in result.matches if m.signature.id == "cuda_oom_message"] == [data.count(b"\n")]


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_blocks_searched_only_for_each_signatures_first_match_give_the_same_last_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parts: int
) -> None:
    # Several MiB where signatures have their five first lines early and then come back block
    # after block: a file's blocks are then searched for the first match of each signature only,
    # and the last line is found again in the last block that holds one.
    rng = random.Random(parts)
    oom_kill = b"[3017506.733819] Out of memory: Kill process 25635 (python) score 974 or sacrifice child"
    lines = [oom_kill] * 6 + [OOM] * 6
    for _ in range(80000):
        pick = rng.random()
        lines.append(OOM if pick < 0.0005 else oom_kill if pick < 0.0007 else filler(rng, 1).rstrip(b"\n"))
    lines += [OOM] + [b"step 1"] * 50 + [OOM, oom_kill]
    last_oom = b"\n".join(lines).count(b"\n")
    last_kill = last_oom + 1
    # Then more than a block where Hyperscan matches kernel_oom_kill across two lines ("Out of memory"
    # ending one, "Killed process" starting the next), which re rejects: such blocks do not hold the
    # signature. At the very end, a signature seen nowhere before: that block is searched in full.
    across = b"[3017506.733819] Out of memory\nKilled process 25635 (python)"
    for step in range(30000):
        lines.append(across if step % 1000 == 0 else filler(rng, 1).rstrip(b"\n"))
    lines += [b"Killed", across]
    data = b"\n".join(lines) + b"\n"
    assert len(data) > 5 * BLOCK_SIZE
    expected = SCANNER.scan(small_blocks(data, 1 << 20))
    result, _ = in_ranges(tmp_path, data, parts, monkeypatch)
    assert result.matches == expected.matches
    assert result.lines == expected.lines
    assert [m.line for m in result.matches if m.signature.id == "kernel_oom_kill"][-1] == last_kill
    assert [m.line for m in result.matches if m.signature.id == "cuda_oom_message"][-1] == last_oom
