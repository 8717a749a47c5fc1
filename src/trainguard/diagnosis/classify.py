"""The classifier: observations in, one diagnosis out. Pure: no I/O, no clock.

How it weighs:
1. A line counts once, for its heaviest reading (a root reading before any cascade one); a wrapper
   line (torchrun's summary) keeps only its root readings.
2. Support observations (telemetry before the death) count only for a cause something else names.
   Cascade observations (an NCCL watchdog timeout, a launcher's SIGTERM to the other ranks, the Python
   exception that wraps a failure) count at a fraction of their weight when a root observation of
   another cause is strong: they are echoes of that failure.
3. Independent observations of one cause combine like independent witnesses:
   confidence = 1 - prod(1 - w) over its distinct rules (a rule repeated a thousand times is one witness;
   the lines that only report a SIGKILL are one witness together).
4. The most confident cause wins; on a tie the earliest evidence wins (the first failure is the root).
   Below MIN_CONFIDENCE nothing decides: the cause is unknown, the readings are alternatives, and
   the evidence shown is the leading alternative's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from trainguard.causes import UNKNOWN
from trainguard.diagnosis.evidence import Observation
from trainguard.diagnosis.signatures import Role

CASCADE_FACTOR = 0.3
STRONG_ROOT = 0.5  # a root observation at least this heavy makes other causes' cascades echoes
MIN_CONFIDENCE = 0.25  # below this nothing decides: the cause is unknown
MIN_ALTERNATIVE = 0.05
MAX_ALTERNATIVES = 4
MAX_EVIDENCE = 8


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    confidence: float
    evidence: tuple[Observation, ...]
    alternatives: tuple[tuple[str, float], ...]


def _one_reading_per_line(observations: Sequence[Observation]) -> list[Observation]:
    by_line: dict[tuple, list[Observation]] = defaultdict(list)
    kept: list[Observation] = []
    for obs in observations:
        if obs.line is None:
            kept.append(obs)
        else:
            by_line[(obs.source, obs.file, obs.line)].append(obs)
    for line_readings in by_line.values():
        readings = line_readings
        if any(r.role is Role.WRAPPER for r in readings):
            readings = [r for r in readings if r.role is Role.ROOT]
        if any(r.role is Role.ROOT for r in readings):
            # "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR" is the cuDNN status, whatever
            # the exception that carries it: a specific reading beats a generic echo of the same line.
            readings = [r for r in readings if r.role is not Role.CASCADE]
        if readings:
            heaviest = max(readings, key=lambda r: r.weight)
            note = heaviest.note or next((r.note for r in readings if r.note), None)
            # The heaviest row reads the line; an ambiguous row reads it several ways at once, and
            # each of its readings stands (what another reading of the line knows stays as a note).
            kept += [replace(r, note=r.note or note) for r in readings if r.rule == heaviest.rule]
    return kept


def _effective_weights(observations: Sequence[Observation]) -> list[tuple[Observation, float]]:
    strong_root_causes = {o.cause for o in observations if o.role is Role.ROOT and o.weight >= STRONG_ROOT}
    named = {o.cause for o in observations if o.role is not Role.SUPPORT and o.weight > 0}
    weighted = []
    for obs in observations:
        weight = obs.weight
        if obs.role is Role.CASCADE and strong_root_causes - {obs.cause}:
            weight *= CASCADE_FACTOR
        if obs.role is Role.SUPPORT and obs.cause not in named:
            weight = 0.0
        weighted.append((obs, weight))
    return weighted


def _witness(obs: Observation) -> str:
    """Which independent witness an observation is. Lines that only report one event (the shell's
    `Killed`, exit status 137 and a launcher's exitcode -9 all say "a process got SIGKILL";
    `Segmentation fault` and exit status 139 "it got SIGSEGV") are one witness together, however many
    of them print it."""
    return f"event:{obs.witness}" if obs.witness else obs.rule


def _combine(weights: Sequence[float]) -> float:
    remaining = 1.0
    for weight in weights:
        remaining *= 1.0 - weight
    return 1.0 - remaining


def classify(observations: Sequence[Observation]) -> Diagnosis:
    readings = _one_reading_per_line(observations)
    weighted = [(o, w) for o, w in _effective_weights(readings) if w > 0]

    per_rule: dict[str, dict[str, float]] = defaultdict(dict)  # cause -> witness -> heaviest weight
    earliest: dict[str, tuple[int, int]] = {}
    for obs, weight in weighted:
        rules = per_rule[obs.cause]
        witness = _witness(obs)
        rules[witness] = max(weight, rules.get(witness, 0.0))
        if obs.cause not in earliest or obs.order < earliest[obs.cause]:
            earliest[obs.cause] = obs.order
    scores = {cause: _combine(list(rules.values())) for cause, rules in per_rule.items()}
    ranked = sorted(scores, key=lambda c: (-round(scores[c], 6), earliest[c]))

    if not ranked or scores[ranked[0]] < MIN_CONFIDENCE:
        cause, confidence = UNKNOWN, 0.0
        others = ranked
    else:
        cause, confidence = ranked[0], scores[ranked[0]]
        others = ranked[1:]
    alternatives = tuple((c, round(scores[c], 3)) for c in others if scores[c] >= MIN_ALTERNATIVE)[:MAX_ALTERNATIVES]
    # Nothing decides: the lines of the leading alternative are still what a person should read.
    shown = cause if cause != UNKNOWN else (alternatives[0][0] if alternatives else UNKNOWN)
    return Diagnosis(
        cause=cause,
        confidence=round(confidence, 3),
        evidence=_pick_evidence([(o, w) for o, w in weighted if o.cause == shown]),
        alternatives=alternatives,
    )


def _pick_evidence(weighted: Sequence[tuple[Observation, float]]) -> tuple[Observation, ...]:
    """The lines a person should read: the heaviest reading of each rule (earliest on ties), and the
    last one too (the final exception is the one that ended the job), in the order they happened."""
    chosen: dict[str, Observation] = {}
    last: dict[str, Observation] = {}
    for obs, _weight in sorted(weighted, key=lambda ow: (-ow[1], ow[0].order)):
        chosen.setdefault(obs.rule, obs)
    for obs, _ in weighted:
        if obs.rule not in last or obs.order > last[obs.rule].order:
            last[obs.rule] = obs
    picked = {id(o): o for o in chosen.values()}
    for obs in last.values():
        picked.setdefault(id(obs), obs)
    ordered = sorted(picked.values(), key=lambda o: ({"kernel": 1, "exit": 2}.get(o.source, 0), o.order))
    return tuple(ordered[:MAX_EVIDENCE])
