"""The training-side library: checkpoints that survive kills, exact resume, OOM-adaptive batches.
No dependency on the supervisor; torch is imported only when the state holds tensors."""

from trainguard.checkpoint._format import CheckpointError, DamagedCheckpoint
from trainguard.checkpoint.adaptive import AdaptiveBatch, BatchTooLargeError, adaptive_batch
from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.rng import capture_rng, restore_rng

__all__ = [
    "AdaptiveBatch",
    "BatchTooLargeError",
    "CheckpointError",
    "Checkpointer",
    "DamagedCheckpoint",
    "adaptive_batch",
    "capture_rng",
    "restore_rng",
]
