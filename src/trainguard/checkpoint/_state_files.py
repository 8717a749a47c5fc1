"""A training state as a checkpoint's files and back (see ``_tree`` and ``_format``): the pickled tree
of a state, its tensors' bytes read straight from the tensors (a save not staged in shared memory),
and a checkpoint folder loaded back into a state."""

from __future__ import annotations

import contextlib
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.checkpoint import _tree
from trainguard.checkpoint._format import DATA_FILE, TREE_FILE, DamagedCheckpoint
from trainguard.checkpoint._verified_read import read_into, read_manifest, read_verified


@contextlib.contextmanager
def _quiet_torch_storage() -> Iterator[None]:
    """torch's own pickling of sparse and quantized tensors warns that TypedStorage is deprecated: its
    business, not the user's, and it would be printed at every save and load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
        yield


def pickle_tree(skeleton: Any, specs: list[_tree.TensorSpec]) -> bytes:
    """The state without its tensors, as it is written to the tree file."""
    with _quiet_torch_storage():
        return pickle.dumps({"skeleton": skeleton, "specs": specs}, protocol=pickle.HIGHEST_PROTOCOL)


def direct_chunks(tensors: list[Any], specs: list[_tree.TensorSpec]) -> Iterator[memoryview | bytes]:
    """Tensor bytes straight from the tensors (a GPU tensor is copied to the host one at a time)."""
    position = 0
    for tensor, spec in zip(tensors, specs):
        if spec.offset > position:
            yield bytes(spec.offset - position)
        host = tensor.detach().to("cpu").contiguous()
        if spec.nbytes:
            yield _tree.raw_view(host)
        position = spec.offset + spec.nbytes


def load_state(path: Path, map_location: str | None) -> Any:
    """The state saved in a checkpoint folder (or one shard of it), every file checked against its
    manifest. Tensors load on ``map_location``, or where they were saved when it is None."""
    manifest = read_manifest(path)
    try:
        with _quiet_torch_storage():
            tree = pickle.loads(read_verified(path, TREE_FILE, manifest))
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise DamagedCheckpoint(f"{path.name}/{TREE_FILE}: {exc}") from exc
    specs: list[_tree.TensorSpec] = tree["specs"]
    if not specs:
        return _tree.rebuild(tree["skeleton"], lambda index: None)
    import torch

    # Each tensor gets its own storage, read straight from the file: no second copy of the state
    # in memory, and nothing later (torch.save, set_rng_state) sees a view into a shared buffer.
    tensors = [torch.empty(spec.shape, dtype=getattr(torch, spec.dtype)) for spec in specs]
    read_into(path, DATA_FILE, manifest, [(s.offset, _tree.raw_view(t)) for s, t in zip(specs, tensors)])

    def make(index: int) -> Any:
        device = map_location if map_location is not None else specs[index].device
        return tensors[index] if device == "cpu" else tensors[index].to(device)

    return _tree.rebuild(tree["skeleton"], make)
