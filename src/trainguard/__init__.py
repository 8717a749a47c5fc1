"""trainguard keeps GPU training jobs alive: it names why a job died, with the evidence and the fix,
and restarts it from its latest checkpoint.

The training-side library (importing it pulls in neither the CLI nor torch)::

    from trainguard import Checkpointer, adaptive_batch
"""

import os as _os

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
