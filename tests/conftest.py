from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parent / "corpus"


def load_corpus(part: str = "dev") -> list[dict]:
    """Real crash logs labelled by root cause (tests/corpus/README.md): "dev" to tune against,
    "holdout" never to be tuned against."""
    path = CORPUS / f"{part}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trainguard_cmd() -> list[str]:
    return [sys.executable, "-m", "trainguard"]


def is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state folder of the test's own, for every trainguard the test starts: no test reads or
    writes the state of the person running the tests (~/.local/state/trainguard). Whatever the test
    left running with this folder (supervisors, jobs, checkpoint writers) is killed when it ends,
    passed or failed."""
    folder = tmp_path / "state"
    monkeypatch.setenv("TRAINGUARD_HOME", str(folder))
    yield folder
    if folder.exists():
        _kill_processes_with_home(folder)


def _kill_processes_with_home(folder: Path) -> None:
    marker = f"TRAINGUARD_HOME={folder}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
