"""adaptive_batch against torch's real OutOfMemoryError type, raised past a memory threshold the way
the caching allocator raises it (a GPU machine proves it against a real CUDA OOM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainguard import BatchTooLargeError, adaptive_batch


class GpuWithLimit:
    """A stand-in for GPU memory only: the step's real work runs on the CPU; past ``max_samples`` in
    one micro-batch it raises what PyTorch raises, the real torch.cuda.OutOfMemoryError type."""

    def __init__(self, max_samples: int) -> None:
        self.max_samples = max_samples
        self.sizes: list[int] = []

    def check(self, samples: int) -> None:
        self.sizes.append(samples)
        if samples > self.max_samples:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {samples * 64} MiB. GPU 0 has a total capacity of 23.65 GiB"
            )


def _model_and_batch():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    x = torch.randn(32, 6)
    y = torch.randn(32, 1)
    return model, x, y


def test_oom_halves_the_micro_batch_and_keeps_the_effective_batch(tmp_path: Path) -> None:
    model, x, y = _model_and_batch()
    full = torch.nn.functional.mse_loss(model(x), y)
    full.backward()
    expected = model.weight.grad.clone()
    model.zero_grad()

    gpu = GpuWithLimit(max_samples=5)

    @adaptive_batch(batch_size=32, zero_grad=model.zero_grad, state_dir=tmp_path)
    def micro_step(micro, weight):
        gpu.check(len(micro[0]))
        loss = torch.nn.functional.mse_loss(model(micro[0]), micro[1]) * weight
        loss.backward()
        return loss.item()

    losses = micro_step((x, y))
    assert micro_step.micro_batch == 4 and micro_step.accumulation_steps == 8
    assert gpu.sizes[:4] == [32, 16, 8, 4]  # halved after each OOM, then the whole batch in 4s
    assert sum(losses) == pytest.approx(full.item(), rel=1e-5)
    assert torch.allclose(model.weight.grad, expected, atol=1e-6)  # same gradient as the full batch
    assert json.loads((tmp_path / "adaptive_batch.json").read_text()) == {"batch_size": 32, "micro_batch": 4}


def test_a_restart_starts_from_the_recorded_micro_batch(tmp_path: Path) -> None:
    (tmp_path / "adaptive_batch.json").write_text(json.dumps({"batch_size": 32, "micro_batch": 8}))
    sizes = []
    step = adaptive_batch(lambda micro, weight: sizes.append(len(micro)), batch_size=32, state_dir=tmp_path)
    step(torch.zeros(32, 3))
    assert sizes == [8, 8, 8, 8]


def test_trainguard_batch_scale_shrinks_the_first_micro_batch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAINGUARD_BATCH_SCALE", "0.25")
    step = adaptive_batch(lambda micro, weight: None, batch_size=64, state_dir=tmp_path)
    assert step.micro_batch == 16


def test_dict_batches_are_sliced_together(tmp_path: Path) -> None:
    weights = []
    gpu = GpuWithLimit(max_samples=3)

    def micro_step(micro, weight):
        gpu.check(len(micro["input"]))
        assert len(micro["input"]) == len(micro["label"])
        weights.append(weight)

    adaptive_batch(micro_step, batch_size=10, state_dir=tmp_path)(
        {"input": torch.zeros(10, 2), "label": torch.zeros(10)}
    )
    assert gpu.sizes == [10, 5, 2, 2, 2, 2, 2]
    assert weights == [0.2] * 5


def test_below_one_sample_it_errors_clearly(tmp_path: Path) -> None:
    gpu = GpuWithLimit(max_samples=0)
    step = adaptive_batch(lambda micro, weight: gpu.check(len(micro)), batch_size=8, state_dir=tmp_path)
    with pytest.raises(BatchTooLargeError, match="micro-batch of 1 sample"):
        step(torch.zeros(8))
    assert gpu.sizes == [8, 4, 2, 1]


def test_other_errors_pass_through_untouched(tmp_path: Path) -> None:
    def broken(micro, weight):
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        adaptive_batch(broken, batch_size=4, state_dir=tmp_path)(torch.zeros(4))


def test_old_pytorch_runtime_error_wording_counts_as_oom(tmp_path: Path) -> None:
    calls = []

    def old_style(micro, weight):
        calls.append(len(micro))
        if len(micro) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 10.92 GiB total capacity)")

    adaptive_batch(old_style, batch_size=4, state_dir=tmp_path)(torch.zeros(4))
    assert calls == [4, 2, 2]
