"""The detached supervisor of one run:
``python -m trainguard.supervisor RUN_ID [--handshake FD] [--adopt] [--restart] [--lock-fd FD --lock-since T]``
(``--lock-fd``: the run's supervisor lock, taken at time T by the command that created the run)."""

from __future__ import annotations

import signal
import sys

from trainguard.supervisor.service import supervise_run


def _value(rest: list[str], flag: str) -> str | None:
    return rest[rest.index(flag) + 1] if flag in rest else None


def main(argv: list[str]) -> int:
    # A stop signal before the supervisor's handlers are in place waits for them (they unblock it):
    # `trainguard stop` may find this process holding the run's lock from its first moment.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    run_id, rest = argv[0], argv[1:]
    handshake, lock_fd = _value(rest, "--handshake"), _value(rest, "--lock-fd")
    return supervise_run(
        run_id,
        adopt="--adopt" in rest,
        restart="--restart" in rest,
        handshake_fd=int(handshake) if handshake is not None else None,
        handed_lock=(int(lock_fd), float(_value(rest, "--lock-since") or 0)) if lock_fd is not None else None,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
