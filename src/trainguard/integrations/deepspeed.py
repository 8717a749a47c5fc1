"""DeepSpeed: resume from the newest complete tag and save on a stop signal.

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, ...)
    _, client = load_checkpoint(engine, save_dir)          # (None, None) when starting fresh
    start = client["step"] + 1 if client else 0
    guard = PreemptionGuard()
    for step in range(start, total_steps):
        ...
        if guard.step_end(step, save=lambda: engine.save_checkpoint(save_dir, client_state={"step": step})):
            break

``engine.load_checkpoint(save_dir)`` alone loads the tag named by ``latest``, even when that tag was
cut short (a power loss leaves 0-byte files behind ``latest``); ``load_checkpoint`` here loads the tag
trainguard chose (``TRAINGUARD_RESUME_FROM``), else the newest complete tag in ``save_dir``.
"""

from __future__ import annotations

import os
from typing import Any

from trainguard.checkpoint import layouts
from trainguard.integrations.loop import PreemptionGuard, resume_path

__all__ = ["PreemptionGuard", "load_checkpoint"]


def load_checkpoint(engine: Any, save_dir: str | None = None, **kwargs: Any) -> tuple[Any, Any]:
    """``engine.load_checkpoint`` of the newest complete tag: DeepSpeed's (load path, client state),
    or (None, None) when there is none. ``kwargs`` go to ``engine.load_checkpoint``."""
    path = resume_path()
    if path is None and save_dir is not None:
        newest = layouts.newest_complete(save_dir, "deepspeed")
        path = newest.path if newest else None
    if path is None:
        return None, None
    load_dir, tag = os.path.split(os.path.normpath(path))
    return engine.load_checkpoint(load_dir, tag=tag, **kwargs)
