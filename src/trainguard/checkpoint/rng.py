"""Capture and restore every random number generator a training run draws from, for exact resume."""

from __future__ import annotations

import random
import sys
from typing import Any


def capture_rng() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's (CPU and every CUDA device) generators, as far as
    those libraries are loaded. Store it in the checkpoint; ``restore_rng`` puts it back."""
    state: dict[str, Any] = {"python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_python_state(state["python"]))
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"].to("cpu") if hasattr(state["torch"], "to") else state["torch"])
        if "torch_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["torch_cuda"])


def _as_python_state(value: Any) -> tuple:
    # random.getstate() is (version, tuple_of_ints, gauss_next); a round trip may turn tuples into lists.
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
