"""A real Prometheus server for the tests (Debian's ``prometheus`` binary), run with a config the
test prepares, its storage in a temporary folder and a free loopback port, and queried through its
HTTP API the way Grafana and people do."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.real.runs import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "trainguard-rules.yml"
RULE_TESTS = ROOT / "monitoring" / "trainguard-rules.test.yml"
EXAMPLE_CONFIG = ROOT / "monitoring" / "prometheus.yml"
DASHBOARD = ROOT / "dashboards" / "trainguard-grafana.json"
INSTALL_HINT = "apt-get install prometheus (Debian/Ubuntu), or put prometheus and promtool on PATH"


def why_no(binary: str) -> str | None:
    return None if shutil.which(binary) else f"{binary} is not installed ({INSTALL_HINT})"


class PrometheusError(AssertionError):
    pass


class Prometheus:
    """One Prometheus process running ``config`` from its folder, with its storage in ``folder/data``."""

    def __init__(self, folder: Path, config: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (folder / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=folder,
        )  # fmt: skip
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise PrometheusError(f"prometheus was not ready within {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        self.log.flush()
        return (self.folder / "prometheus.log").read_text(errors="replace")[-3000:]

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: [{"metric": {labels}, "value": float}, ...]."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr!r} returned a {data['resultType']}, not a vector")
        return [{"metric": r["metric"], "value": float(r["value"][1])} for r in data["result"]]

    def wait_for(
        self, expr: str, until: Callable[[list[dict[str, Any]]], bool] = bool, timeout: float = 45
    ) -> list[dict[str, Any]]:
        """Query until the result satisfies ``until``; fail with the last result and the targets' health."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if until(result):
                return result
            if time.monotonic() > deadline:
                health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.api("targets")["activeTargets"]]
                raise PrometheusError(f"{expr!r} never satisfied the condition; last result {result}; targets {health}")
            time.sleep(0.5)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
