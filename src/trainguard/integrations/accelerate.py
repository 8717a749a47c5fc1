"""Accelerate: resume from the newest complete ``save_state`` and save on a stop signal.

    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "out"), automatic_checkpoint_naming=True))
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    load_state(accelerator)                       # the newest complete checkpoints/checkpoint_N, if any
    guard = PreemptionGuard()
    for step in range(start, total_steps):
        ...
        if guard.step_end(step, save=accelerator.save_state):
            break

Accelerate itself would take the highest ``checkpoint_N`` even when a kill cut it short, and refuse
to save into a folder that exists: ``load_state`` loads the one trainguard chose
(``TRAINGUARD_RESUME_FROM``, else the newest complete one in the project's ``checkpoints``) and numbers
the next automatic save after every folder there, so a cut folder is neither loaded nor written into.
"""

from __future__ import annotations

import os
import re
from typing import Any

from trainguard.checkpoint import layouts
from trainguard.integrations.loop import PreemptionGuard, resume_path

__all__ = ["PreemptionGuard", "load_state"]

_AUTOMATIC = re.compile(r"^checkpoint_([0-9]+)$")


def load_state(accelerator: Any, folder: str | None = None, **kwargs: Any) -> str | None:
    """Load the newest complete state into ``accelerator`` and return its folder (None: nothing to
    resume from). ``folder``: where to look when not run under trainguard (default: the project's
    ``checkpoints``); ``kwargs`` go to ``accelerator.load_state``."""
    config = accelerator.project_configuration
    automatic = os.path.join(accelerator.project_dir, "checkpoints") if config.automatic_checkpoint_naming else None
    path = resume_path()
    if path is None and (folder or automatic):
        newest = layouts.newest_complete(folder or automatic, "accelerate")
        path = newest.path if newest else None
    if automatic and os.path.isdir(automatic):
        numbers = [int(m.group(1)) for name in os.listdir(automatic) if (m := _AUTOMATIC.match(name))]
        if numbers:
            config.iteration = max(numbers) + 1
    if path is not None:
        accelerator.load_state(path, **kwargs)
    return path
