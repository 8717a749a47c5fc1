"""trainguard keeps GPU training jobs alive: it names why a job died, with the evidence and the fix,
and restarts it from its latest checkpoint.

The training-side library (importing it pulls in neither the CLI nor torch)::

    from trainguard import Checkpointer, adaptive_batch
"""

import os as _os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.checkpoint import (
        AdaptiveBatch,
        BatchTooLargeError,
        Checkpointer,
        CheckpointError,
        DamagedCheckpoint,
        adaptive_batch,
        capture_rng,
        restore_rng,
    )
    from trainguard.errorfile import record

# The library's names are imported on first use: `trainguard diagnose` and the other commands start
# without loading the checkpoint library (half of their start-up time when it was imported here).
_LAZY = {
    "AdaptiveBatch": "trainguard.checkpoint",
    "BatchTooLargeError": "trainguard.checkpoint",
    "CheckpointError": "trainguard.checkpoint",
    "Checkpointer": "trainguard.checkpoint",
    "DamagedCheckpoint": "trainguard.checkpoint",
    "adaptive_batch": "trainguard.checkpoint",
    "capture_rng": "trainguard.checkpoint",
    "restore_rng": "trainguard.checkpoint",
    "record": "trainguard.errorfile",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__version__ = "0.1.0"

__all__ = [
    "AdaptiveBatch",
    "BatchTooLargeError",
    "CheckpointError",
    "Checkpointer",
    "DamagedCheckpoint",
    "__version__",
    "adaptive_batch",
    "capture_rng",
    "record",
    "restore_rng",
]

# Under `trainguard run`, an uncaught exception in the training script reaches the supervisor's
# diagnosis through the error file.
if _os.environ.get("TRAINGUARD_ERROR_FILE"):
    from trainguard.errorfile import install_excepthook as _install_excepthook

    _install_excepthook()
