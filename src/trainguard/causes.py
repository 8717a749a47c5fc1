"""The cause catalogue (DESIGN section 4) as data: ids, titles and fixes in English and Chinese,
the default retry policy, and the evidence kinds that can prove each cause."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cache

from trainguard._resources import load_toml
from trainguard.errors import DataError


class Retry(str, Enum):
    YES = "yes"
    NO = "no"
    ONCE = "once"


# How `run --foreground` exits when a run ends failed with a cause (DESIGN section 5), so that Slurm,
# Kubernetes (podFailurePolicy onExitCodes), Kubeflow and Ray can act on the verdict.
VERDICT_EXIT = {"tempfail": 75, "config": 78, "fail": 1}


@dataclass(frozen=True)
class Cause:
    id: str
    title: dict[str, str]
    fixes: dict[str, tuple[str, ...]]
    retry: Retry
    retry_pause_s: float
    batch_scale: float
    evidence_kinds: tuple[str, ...]
    verdict: str = "fail"
    restart_at_once: bool = False
    restart_budget: int | None = None  # restarts for this cause in one run; None: only --max-restarts

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def title_in(self, lang: str) -> str:
        return self.title.get(lang) or self.title["en"]

    def fixes_in(self, lang: str) -> tuple[str, ...]:
        return self.fixes.get(lang) or self.fixes["en"]


CAUSE_IDS = (
    "cuda_oom",
    "host_oom",
    "shm_exhausted",
    "cuda_driver_mismatch",
    "cuda_illegal_access",
    "gpu_hardware",
    "nccl_failure",
    "sighup",
    "preempted",
    "disk_full",
    "too_many_open_files",
    "segfault",
    "python_error",
    "hang",
    "node_reboot",
    "killed",
    "peer_failure",
    "bad_command",
    "memory_leak",
    "unknown",
)
UNKNOWN = "unknown"


def _parse(raw: dict) -> dict[str, Cause]:
    if tuple(raw) != CAUSE_IDS:
        raise DataError(f"causes.toml must list exactly the cause ids of DESIGN section 4, in order; got {list(raw)}")
    causes = {}
    for cause_id, row in raw.items():
        try:
            causes[cause_id] = Cause(
                id=cause_id,
                title=dict(row["title"]),
                fixes={lang: tuple(items) for lang, items in row["fixes"].items()},
                retry=Retry(row["retry"]),
                retry_pause_s=float(row.get("retry_pause_s", 0)),
                batch_scale=float(row.get("batch_scale", 1.0)),
                evidence_kinds=tuple(row.get("evidence", ())),
                verdict=row["verdict"],
                restart_at_once=bool(row.get("restart_at_once", False)),
                restart_budget=int(row["restart_budget"]) if "restart_budget" in row else None,
            )
        except (KeyError, ValueError) as exc:
            raise DataError(f"causes.toml: bad entry {cause_id!r}: {exc}") from exc
        if causes[cause_id].verdict not in VERDICT_EXIT:
            raise DataError(f"causes.toml: {cause_id!r} has verdict {causes[cause_id].verdict!r}")
        if set(causes[cause_id].title) != {"en", "zh"} or set(causes[cause_id].fixes) != {"en", "zh"}:
            raise DataError(f"causes.toml: {cause_id!r} needs a title and fixes in en and zh")
    return causes


@cache
def catalogue() -> dict[str, Cause]:
    return _parse(load_toml("causes.toml"))


def get(cause_id: str) -> Cause:
    return catalogue()[cause_id]
