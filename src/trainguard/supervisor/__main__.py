"""The detached supervisor of one run:
``python -m trainguard.supervisor RUN_ID [--handshake FD] [--adopt] [--restart]``."""

from __future__ import annotations

import sys

from trainguard.supervisor.service import supervise_run


def main(argv: list[str]) -> int:
    run_id, rest = argv[0], argv[1:]
    handshake = int(rest[rest.index("--handshake") + 1]) if "--handshake" in rest else None
    return supervise_run(run_id, adopt="--adopt" in rest, restart="--restart" in rest, handshake_fd=handshake)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
