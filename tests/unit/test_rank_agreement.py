"""RankAgreement's schedule: the ranks all-reduce at the same calls and nowhere else."""

from __future__ import annotations

from trainguard.checkpoint.agreement import AGREE_EVERY_S, RankAgreement


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_agreements_come_about_once_a_second_at_the_slowest_ranks_pace() -> None:
    clock = Clock()
    reduced: list[list[int]] = []
    other_rank = [0, 0, 0, -4]  # the other rank is slower: it proposes 4 calls until the next agreement

    def reduce(values: list[int]) -> list[int]:
        reduced.append(values)
        return [max(a, b) for a, b in zip(values, other_rank, strict=True)]

    agreement = RankAgreement(clock, reduce)
    assert agreement.decide(0, False, False) == (0, False, False)  # the first call agrees: nothing measured yet
    clock.now += 0.01
    assert agreement.decide(0, False, False) == (0, False, False)  # so does the second
    assert len(reduced) == 2
    # 10 ms a call here: this rank proposes AGREE_EVERY_S / 0.01 calls, the slower rank 4: 4 it is.
    assert reduced[-1][3] == -int(AGREE_EVERY_S / 0.01)
    for _ in range(3):
        clock.now += 0.01
        assert agreement.decide(15, True, False) == (0, False, False)  # between agreements nothing is decided
    assert len(reduced) == 2
    clock.now += 0.01
    assert agreement.decide(15, True, False) == (15, True, False)  # the signal and the due save, held till now
    assert len(reduced) == 3 and reduced[-1][:3] == [15, 1, 0]


def test_another_ranks_signal_or_busy_writer_reaches_every_rank() -> None:
    agreement = RankAgreement(Clock(), lambda values: [max(values[0], 15), max(values[1], 1), 1, -1])
    assert agreement.decide(0, False, False) == (15, True, True)


def test_without_torch_distributed_each_rank_decides_alone() -> None:
    agreement = RankAgreement(Clock(), lambda values: None)
    assert agreement.decide(15, True, False) is None
