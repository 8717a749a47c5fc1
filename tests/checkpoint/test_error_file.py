"""The error file the supervisor reads: written by @record and by the hook installed under trainguard run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard import record


def test_record_writes_the_exception_and_reraises(tmp_path: Path, monkeypatch) -> None:
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TRAINGUARD_ERROR_FILE", str(error_file))

    @record
    def main() -> None:
        raise KeyError("label 'bird'")

    with pytest.raises(KeyError):
        main()
    payload = json.loads(error_file.read_text())
    assert payload["type"] == "KeyError" and payload["message"] == "\"label 'bird'\""
    assert "in main" in payload["traceback"] and payload["pid"] == os.getpid() and payload["time"] > 0


def test_importing_trainguard_under_trainguard_run_installs_the_hook(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TRAINGUARD_ERROR_FILE": str(error_file)}
    code = "import trainguard\nraise RuntimeError('CUDA error: an illegal memory access was encountered')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1 and "Traceback" in done.stderr  # the usual traceback still prints
    payload = json.loads(error_file.read_text())
    assert payload["type"] == "RuntimeError" and "illegal memory access" in payload["message"]


def test_without_the_variable_nothing_is_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TRAINGUARD_ERROR_FILE", raising=False)

    @record
    def main() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        main()
    assert list(tmp_path.iterdir()) == []
