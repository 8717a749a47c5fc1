"""The detached supervisor of one run: ``python -m trainguard.supervisor RUN_ID``."""

from __future__ import annotations

import sys

from trainguard.supervisor.service import supervise_run

if __name__ == "__main__":
    sys.exit(supervise_run(sys.argv[1], adopt="--adopt" in sys.argv[2:]))
