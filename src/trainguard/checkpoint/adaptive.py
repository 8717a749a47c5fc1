"""``adaptive_batch``: survive CUDA out-of-memory by halving the micro-batch and doubling gradient
accumulation, so the effective batch (and the training) stays the same."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("trainguard.adaptive")

STATE_FILE = "adaptive_batch.json"
BATCH_SCALE_ENV = "TRAINGUARD_BATCH_SCALE"


class BatchTooLargeError(RuntimeError):
    """Even a micro-batch of one sample does not fit in GPU memory."""


def is_cuda_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None:
        oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
        if oom_type is not None and isinstance(exc, oom_type):
            return True
    # PyTorch before 1.13 raised a plain RuntimeError with this text.
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def _batch_len(batch: Any) -> int:
    if isinstance(batch, Mapping):
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (int, float)):
        return _batch_len(batch[0])
    return len(batch)


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, Mapping):
        return type(batch)({key: _slice(value, start, stop) for key, value in batch.items()})
    if isinstance(batch, tuple) and batch and not isinstance(batch[0], (int, float)):
        return tuple(_slice(item, start, stop) for item in batch)
    if (
        isinstance(batch, list)
        and batch
        and not isinstance(batch[0], (int, float, str))
        and hasattr(batch[0], "__len__")
    ):
        return [_slice(item, start, stop) for item in batch]
    return batch[start:stop]


def _free_gpu_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class AdaptiveBatch:
    """Calls ``step(micro_batch, weight)`` over micro-batches of each batch; see ``adaptive_batch``."""

    def __init__(
        self,
        step: Callable[[Any, float], Any],
        *,
        batch_size: int,
        zero_grad: Callable[[], Any] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        micro_batch: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.step = step
        self.batch_size = batch_size
        self.zero_grad = zero_grad
        folder = state_dir or os.environ.get("TRAINGUARD_CHECKPOINT_DIR")
        self.state_path = Path(folder) / STATE_FILE if folder else None
        self.micro_batch = micro_batch or self._initial_micro_batch()
        self.oom_count = 0

    def _initial_micro_batch(self) -> int:
        micro = self.batch_size
        try:
            scale = float(os.environ.get(BATCH_SCALE_ENV, "1"))
        except ValueError:
            scale = 1.0
        if 0 < scale < 1:
            micro = max(1, math.floor(self.batch_size * scale))
        recorded = self._recorded()
        if recorded is not None:
            micro = min(micro, recorded)
        return micro

    def _recorded(self) -> int | None:
        if self.state_path is None:
            return None
        try:
            saved = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None
        if saved.get("batch_size") != self.batch_size or not isinstance(saved.get("micro_batch"), int):
            return None
        return max(1, saved["micro_batch"])

    def _record(self) -> None:
        if self.state_path is None:
            return
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"batch_size": self.batch_size, "micro_batch": self.micro_batch}))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.warning("cannot record the micro-batch size in %s: %s", self.state_path, exc)

    @property
    def accumulation_steps(self) -> int:
        return math.ceil(self.batch_size / self.micro_batch)

    def __call__(self, batch: Any) -> list[Any]:
        total = _batch_len(batch)
        while True:
            try:
                return [
                    self.step(_slice(batch, start, min(start + self.micro_batch, total)),
                              (min(start + self.micro_batch, total) - start) / total)
                    for start in range(0, total, self.micro_batch)
                ]  # fmt: skip
            except Exception as exc:
                if not is_cuda_oom(exc):
                    raise
                self.oom_count += 1
                if self.micro_batch <= 1:
                    raise BatchTooLargeError(
                        "CUDA out of memory with a micro-batch of 1 sample: the model itself does not fit; "
                        "use mixed precision, gradient checkpointing, a smaller model or a larger GPU"
                    ) from exc
                del exc  # its traceback holds the frames (and their tensors) that ran out of memory
                _free_gpu_memory()
                if self.zero_grad is not None:
                    self.zero_grad()  # gradients of the micro-batches that did run are discarded
                self.micro_batch = max(1, self.micro_batch // 2)
                log.warning(
                    "CUDA out of memory: micro-batch %d, gradient accumulation %d (effective batch %d unchanged)",
                    self.micro_batch, self.accumulation_steps, self.batch_size,
                )  # fmt: skip
                self._record()


def adaptive_batch(
    step: Callable[[Any, float], Any] | None = None,
    *,
    batch_size: int,
    zero_grad: Callable[[], Any] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> Any:
    """Wrap a micro-batch step so that CUDA out-of-memory shrinks the micro-batch instead of killing
    the run. ``step(micro_batch, weight)`` runs forward and backward on a slice of the batch and
    scales its loss by ``weight`` (the slice's share of the batch) before ``backward()``::

        @adaptive_batch(batch_size=64, zero_grad=optimizer.zero_grad)
        def micro_step(micro, weight):
            loss = criterion(model(micro[0]), micro[1]) * weight
            loss.backward()
            return loss.item()

        for batch in loader:
            optimizer.zero_grad()
            micro_step(batch)          # on OOM: micro-batch halves, accumulation doubles, batch retried
            optimizer.step()

    The working micro-batch is recorded in ``state_dir`` (default TRAINGUARD_CHECKPOINT_DIR), so a
    restarted run starts from it; TRAINGUARD_BATCH_SCALE (halved by ``trainguard run`` after a
    cuda_oom death) scales the first micro-batch. Batches are tensors, or tuples/lists/dicts of them,
    sliced along their first dimension.
    """
    if step is None:
        return lambda fn: AdaptiveBatch(fn, batch_size=batch_size, zero_grad=zero_grad, state_dir=state_dir)
    return AdaptiveBatch(step, batch_size=batch_size, zero_grad=zero_grad, state_dir=state_dir)
