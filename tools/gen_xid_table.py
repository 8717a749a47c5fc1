"""Derive trainguard's Xid table from the reference catalogue in tools/reference/xid.json.

The package does not ship the reference catalogue, so the facts it needs (name, NVIDIA's likely cause and
actions, one-line action) are copied into src/trainguard/data/xids.json together with the cause and
weight the classifier gives each Xid. Run it again when the reference changes:

    python tools/gen_xid_table.py [tools/reference/xid.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# How strongly one Xid line proves a cause on its own, by NVIDIA's likely cause (xid.json's
# likely_cause). user_app Xids (13, 31, 43, ...) are what a bad kernel or an illegal access leaves in
# the kernel log; every other class points at the GPU, its memory, its links or its firmware.
CAUSE_BY_LIKELY_CAUSE = {
    "user_app": ("cuda_illegal_access", 0.6),
    "hardware": ("gpu_hardware", 0.95),
    "memory_ecc": ("gpu_hardware", 0.9),
    "thermal_power": ("gpu_hardware", 0.85),
    "nvlink": ("gpu_hardware", 0.85),
    "gsp": ("gpu_hardware", 0.85),
    "driver": ("gpu_hardware", 0.6),
    "unknown": ("gpu_hardware", 0.5),
}
# NVIDIA says "no action required" for these: informational (page retirement recorded, corrected
# errors); they corroborate a hardware cause but cannot prove a death on their own.
INFORMATIONAL_DISCOUNT = 0.3
# Xid 45 is printed whenever a process that holds a GPU channel is killed (OOM killer, Ctrl+C, a
# launcher's SIGKILL): a consequence of the death, never its cause.
OVERRIDES = {45: ("cuda_illegal_access", 0.1)}


def derive(reference: dict) -> dict:
    rows = []
    for entry in reference["xids"]:
        cause, weight = CAUSE_BY_LIKELY_CAUSE[entry["likely_cause"]]
        if entry["nvidia_immediate_action"].startswith("IGNORE"):
            weight = round(weight * INFORMATIONAL_DISCOUNT, 3)
        cause, weight = OVERRIDES.get(entry["xid"], (cause, weight))
        rows.append(
            {
                "xid": entry["xid"],
                "name": entry["name"],
                "likely_cause": entry["likely_cause"],
                "immediate_action": entry["nvidia_immediate_action"],
                "action": entry["action"],
                "cause": cause,
                "weight": weight,
            }
        )
    return {
        "source": "derived by tools/gen_xid_table.py from tools/reference/xid.json (gathered "
        + reference.get("gathered", "?")
        + "); facts from NVIDIA's Xid catalog, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
        "unknown_xid": {"cause": "gpu_hardware", "weight": 0.5},
        "xids": rows,
    }


def main(argv: list[str]) -> int:
    reference_path = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent / "reference/xid.json"
    out = Path(__file__).parents[1] / "src/trainguard/data/xids.json"
    table = derive(json.loads(reference_path.read_text()))
    out.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(table['xids'])} Xids to {out}")
    return 0


if __name__ == "__main__":
    from trainguard._script import run_script

    run_script(lambda: main(sys.argv))
