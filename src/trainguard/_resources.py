"""Access to the data files shipped inside the package (signatures, causes, Xid table, examples)."""

from __future__ import annotations

import json
import sys
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def data_text(name: str) -> str:
    return resources.files("trainguard").joinpath("data").joinpath(name).read_text(encoding="utf-8")


def data_path(name: str) -> Any:
    """A Traversable for a shipped file; use ``resources.as_file`` for a real path."""
    return resources.files("trainguard").joinpath("data").joinpath(name)


def load_toml(name: str) -> dict[str, Any]:
    return tomllib.loads(data_text(name))


def load_json(name: str) -> Any:
    return json.loads(data_text(name))
