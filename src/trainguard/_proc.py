"""Whether a process exists: the one question about other processes every part of trainguard asks."""

from __future__ import annotations

import os


def pid_alive(pid: int | None) -> bool:
    """True while ``pid`` exists (even owned by another user); a vanished process is not an error."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
