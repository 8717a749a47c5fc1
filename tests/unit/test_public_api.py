"""The names users import are a contract (DESIGN section 5); importing them stays light."""

from __future__ import annotations

import subprocess
import sys

import trainguard


def test_exported_names_are_pinned() -> None:
    assert sorted(trainguard.__all__) == [
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
    for name in trainguard.__all__:
        assert getattr(trainguard, name) is not None


def test_the_library_imports_neither_torch_nor_the_cli() -> None:
    code = (
        "import sys, trainguard; print(sorted(m for m in ('torch', 'click', 'rich', 'hyperscan') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
