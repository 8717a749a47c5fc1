"""Splitting a training state into its tensors and the rest, and putting it back together. Pure.

Tensors are written as raw bytes (one data file, each tensor at an aligned offset) so that saving is a
plain memory copy and a sequential write; everything else (the nesting, numbers, strings, optimizer
hyper-parameters, NumPy arrays) is pickled with tensors replaced by references. torch is touched only
when the state holds tensors.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ALIGN = 64


@dataclass(frozen=True)
class TensorRef:
    index: int


@dataclass(frozen=True)
class TensorSpec:
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    device: str


def _is_tensor(obj: Any) -> bool:
    """A tensor whose bytes are one dense block on a real device: copied raw into the data file.
    Any other tensor (sparse, quantized, nested, meta) stays in the tree, pickled by torch itself:
    copying it as dense bytes raised out of ``save`` and ended the training."""
    torch = sys.modules.get("torch")
    return (
        torch is not None
        and isinstance(obj, torch.Tensor)
        and obj.layout == torch.strided
        and not obj.is_quantized
        and not getattr(obj, "is_nested", False)
        and obj.device.type != "meta"
    )


def flatten(state: Any) -> tuple[Any, list[Any]]:
    """(skeleton, tensors): the state with every tensor replaced by a TensorRef into ``tensors``."""
    from collections import OrderedDict

    tensors: list[Any] = []
    seen: dict[int, TensorRef] = {}

    def walk(obj: Any) -> Any:
        if _is_tensor(obj):
            ref = seen.get(id(obj))
            if ref is None:
                ref = seen[id(obj)] = TensorRef(len(tensors))
                tensors.append(obj)
            return ref
        if isinstance(obj, OrderedDict):  # what state_dict() returns; restored as such on load
            return _Ordered((key, walk(value)) for key, value in obj.items())
        if type(obj) is dict:
            return {key: walk(value) for key, value in obj.items()}
        if type(obj) is list:
            return [walk(item) for item in obj]
        if type(obj) is tuple:
            return tuple(walk(item) for item in obj)
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return obj.detach()  # sparse, quantized, nested, meta: pickled by torch (``_is_tensor``)
        return obj  # anything else is pickled as it is

    return walk(state), tensors


class _Ordered(dict):
    """Marks a dict that was an OrderedDict."""


def layout(tensors: list[Any]) -> tuple[list[TensorSpec], int]:
    """Offsets of each tensor in the data file, aligned for fast copies; and the file's size."""
    specs = []
    offset = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        specs.append(
            TensorSpec(
                dtype=str(tensor.dtype).removeprefix("torch."),
                shape=tuple(tensor.shape),
                offset=offset,
                nbytes=nbytes,
                device=str(tensor.device),
            )
        )
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return specs, offset


def rebuild(skeleton: Any, make_tensor: Callable[[int], Any]) -> Any:
    from collections import OrderedDict

    def walk(obj: Any) -> Any:
        if isinstance(obj, TensorRef):
            return make_tensor(obj.index)
        if isinstance(obj, _Ordered):
            return OrderedDict((key, walk(value)) for key, value in obj.items())
        if type(obj) is dict:
            return {key: walk(value) for key, value in obj.items()}
        if type(obj) is list:
            return [walk(item) for item in obj]
        if type(obj) is tuple:
            return tuple(walk(item) for item in obj)
        return obj

    return walk(skeleton)


def raw_view(tensor: Any) -> memoryview:
    """The bytes of a contiguous CPU tensor, without NumPy and without a copy."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())).cast("B")
