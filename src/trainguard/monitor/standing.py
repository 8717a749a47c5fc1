"""Which of a run's recorded alerts still stands (PURE: a function of the run's events and the time):
the latest alert that `top` shows beside a run. An alert stands until what it warned of is over:
- the run ended (a terminal state; the supervisor's "run failed" is recorded just after it): how it
  ended is the run's state and cause, not an alert;
- the episode of a condition alert (one with a ``key``: RAM low, a hot GPU) was recorded as cleared
  (``alert_cleared``, same rule and key);
- the run recovered from the event an alert without a key told of (a death, an Xid, a hang): an
  attempt started after it saved a checkpoint, ended cleanly, or has run ``RECOVERED_AFTER_S``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.store.states import TERMINAL_STATES, RunState

# An attempt that has run this long since a restart runs normally, checkpoint or not (a job that
# saves nowhere trainguard sees).
RECOVERED_AFTER_S = 300.0
# The events the answer depends on: fetch only these.
EVENT_KINDS = ("alert", "alert_cleared", "attempt_started", "attempt_ended", "checkpoint",
               *(f"state:{state.value}" for state in RunState))  # fmt: skip
_ENDED = {f"state:{state.value}" for state in TERMINAL_STATES}
_STATE = "state:"


def standing_alert(events: Sequence[Mapping[str, Any]], *, now: float) -> dict[str, Any] | None:
    """The newest alert of ``events`` (the run's, in recorded order) that still stands, or None."""
    standing: list[Mapping[str, Any]] = []
    ended = False
    # The attempt started after the newest alert without a key, whose progress clears those before it.
    recovering: tuple[Any, float, list[Mapping[str, Any]]] | None = None

    def recovered() -> None:
        nonlocal standing, recovering
        if recovering is not None:
            standing = [a for a in standing if not any(a is b for b in recovering[2])]
            recovering = None

    for event in events:
        kind = event.get("kind")
        if kind == "alert":
            if not ended:  # one recorded after the end tells of the end ("run failed"): over with it
                standing.append(event)
        elif kind.startswith(_STATE):
            ended = kind in _ENDED
            if ended:
                standing, recovering = [], None
        elif kind == "alert_cleared":
            episode = (event.get("rule"), event.get("key"))
            standing = [a for a in standing if a.get("key") is None or (a.get("rule"), a.get("key")) != episode]
        elif kind == "attempt_started":
            told_of = [a for a in standing if a.get("key") is None]
            recovering = (event.get("n"), float(event.get("time", 0.0)), told_of) if told_of else None
        elif recovering is None or event.get("attempt" if kind == "checkpoint" else "n") != recovering[0]:
            continue
        elif kind == "checkpoint" or (kind == "attempt_ended" and not event.get("cause")):
            recovered()
        elif kind == "attempt_ended":  # it died too: its own death is the news now
            recovering = None
    if recovering is not None and now - recovering[1] >= RECOVERED_AFTER_S:
        recovered()
    return dict(standing[-1]) if standing else None
