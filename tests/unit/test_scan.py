"""The streaming scanner: line numbers across blocks, huge lines, bounded memory, engines agree."""

from __future__ import annotations

import pytest

from trainguard.diagnosis.scan import MAX_TEXT, Scanner
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
