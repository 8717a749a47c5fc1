"""Derive trainguard's CUDA/driver table from tools/reference/cuda_driver_compat.json.

For each CUDA toolkit release (major.minor): the Linux driver its GA release needs, and the minimum
driver of its family under minor-version compatibility. Written to src/trainguard/data/cuda_compat.json.

    python tools/gen_cuda_compat.py [tools/reference/cuda_driver_compat.json]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FAMILY_MINIMUM = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


def _driver(text: str | None) -> str | None:
    if not text:
        return None
    match = re.search(r"([0-9]{3}\.[0-9]+(?:\.[0-9]+)?)", text)
    return match.group(1) if match else None


def derive(reference: dict) -> dict:
    rows = []
    for toolkit in reference["cuda_toolkits"]:
        releases = toolkit["toolkit_driver_versions"]
        ga = _driver(releases[0]["linux_x86_64_toolkit_driver"]) if releases else None
        if ga is None:
            continue
        rows.append({
            "cuda": toolkit["cuda"],
            "toolkit_driver": ga,
            "family_minimum_driver": FAMILY_MINIMUM.get(toolkit["cuda"].split(".")[0]),
            "unconfirmed": "unconfirmed" in json.dumps(releases[0]),
        })  # fmt: skip
    return {
        "source": "derived by tools/gen_cuda_compat.py from tools/reference/cuda_driver_compat.json (gathered "
        + reference.get("gathered", "?")
        + "): NVIDIA CUDA Toolkit release notes, Table 3, and the CUDA Compatibility guide",
        "toolkits": rows,
    }


def main(argv: list[str]) -> int:
    default = Path(__file__).parent / "reference/cuda_driver_compat.json"
    reference = Path(argv[1]) if len(argv) > 1 else default
    out = Path(__file__).parents[1] / "src/trainguard/data/cuda_compat.json"
    table = derive(json.loads(reference.read_text()))
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {len(table['toolkits'])} CUDA releases to {out}")
    return 0


if __name__ == "__main__":
    from trainguard._script import run_script

    run_script(lambda: main(sys.argv))
