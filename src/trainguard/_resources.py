"""Access to the data files shipped inside the package (signatures, causes, Xid table, examples)."""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# A real recorded log (a 4-GPU torchrun job whose rank 1 ran out of memory): `diagnose --example` and
# the demo's CUDA OOM replay read it.
EXAMPLE_LOG_PATH = Path(__file__).resolve().parent / "data" / "examples" / "ddp_cuda_oom.log"


def data_text(name: str) -> str:
    return resources.files("trainguard").joinpath("data").joinpath(name).read_text(encoding="utf-8")


def data_path(name: str) -> Any:
    """A Traversable for a shipped file; use ``resources.as_file`` for a real path."""
    return resources.files("trainguard").joinpath("data").joinpath(name)


def load_toml(name: str) -> dict[str, Any]:
    return tomllib.loads(data_text(name))


def load_json(name: str) -> Any:
    return json.loads(data_text(name))
