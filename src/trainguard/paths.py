"""Where trainguard keeps things on disk (DESIGN section 3)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$TRAINGUARD_HOME, else $XDG_STATE_HOME/trainguard, else ~/.local/state/trainguard."""
    env = os.environ if environ is None else environ
    if env.get("TRAINGUARD_HOME"):
        return Path(env["TRAINGUARD_HOME"])
    if env.get("XDG_STATE_HOME"):
        return Path(env["XDG_STATE_HOME"]) / "trainguard"
    return Path.home() / ".local" / "state" / "trainguard"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Derived data that can be rebuilt at any time: $XDG_CACHE_HOME/trainguard or ~/.cache/trainguard."""
    env = os.environ if environ is None else environ
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "trainguard"
    return Path.home() / ".cache" / "trainguard"


def open_private(path: str | os.PathLike[str], mode: str = "w"):
    """Open a file in the state folder for writing, created 0600 (it may hold a run's secrets)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
