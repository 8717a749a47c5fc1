"""A run's life as an explicit state machine; every transition is an event in the registry."""

from __future__ import annotations

from enum import Enum


class RunState(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


TERMINAL_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED})
ACTIVE_STATES = frozenset({RunState.STARTING, RunState.RUNNING, RunState.BACKOFF, RunState.STOPPING})

_ALLOWED = {
    RunState.STARTING: {RunState.RUNNING, RunState.FAILED, RunState.STOPPED},
    RunState.RUNNING: {RunState.BACKOFF, RunState.STOPPING, RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED},
    RunState.BACKOFF: {RunState.STARTING, RunState.STOPPING, RunState.STOPPED, RunState.FAILED},
    RunState.STOPPING: {RunState.STOPPED},
    # `trainguard restart RUN` (or `run --name N` of an ended run) continues an ended run in place.
    RunState.SUCCEEDED: {RunState.STARTING},
    RunState.FAILED: {RunState.STARTING},
    RunState.STOPPED: {RunState.STARTING},
}

# What `status --json` and `ps` show (DESIGN section 5): five words a script can rely on.
PUBLIC_STATE = {
    RunState.STARTING: "running",
    RunState.RUNNING: "running",
    RunState.STOPPING: "running",
    RunState.BACKOFF: "restarting",
    RunState.SUCCEEDED: "succeeded",
    RunState.FAILED: "failed",
    RunState.STOPPED: "stopped",
}


class IllegalTransition(RuntimeError):
    pass


def check_transition(current: RunState, new: RunState) -> None:
    if new not in _ALLOWED.get(current, set()):
        raise IllegalTransition(f"a run cannot go from {current.value} to {new.value}")
