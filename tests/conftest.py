from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "corpus" / "crashlogs-dev.jsonl"


def load_corpus() -> list[dict]:
    if not CORPUS.exists():
        pytest.skip(f"the labelled crash-log corpus is not at {CORPUS} (it lives in ../shared/corpus)")
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def trainguard_cmd() -> list[str]:
    return [sys.executable, "-m", "trainguard"]


def is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of the test's own, for every trainguard the test starts."""
    folder = tmp_path / "state"
    monkeypatch.setenv("TRAINGUARD_HOME", str(folder))
    return folder
