"""Where alerts go: a generic JSON webhook, Slack, DingTalk, Feishu and WeCom bots (with their signing
secrets), configured in a TOML file or with ``--notify KIND=URL``. Secrets and webhook tokens never
appear in logs, status or errors: a notifier is shown by its kind and host only."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import UsageError

log = logging.getLogger("trainguard.notify")

KINDS = ("webhook", "slack", "dingtalk", "feishu", "wecom")
_KEYS = {"kind", "url", "secret", "lang"}
TIMEOUT_S = 10


@dataclass(frozen=True)
class Notifier:
    kind: str
    url: str
    secret: str | None = None
    lang: str = "en"

    def describe(self) -> str:
        """Safe to print: the kind and the host, never the path, query or secret (they are the token)."""
        return f"{self.kind} ({urllib.parse.urlsplit(self.url).hostname})"

    def request(self, message: dict[str, Any], now: float) -> tuple[str, bytes]:
        """The URL and body to POST for one alert (pure: ``now`` is the signing time)."""
        text = f"[trainguard] {message['title']}\n{message['text']}"
        url = self.url
        if self.kind == "webhook":
            body: dict[str, Any] = message
        elif self.kind == "slack":
            body = {"text": text}
        elif self.kind == "dingtalk":
            body = {"msgtype": "text", "text": {"content": text}}
            if self.secret:
                stamp = str(int(now * 1000))
                digest = hmac.new(self.secret.encode(), f"{stamp}\n{self.secret}".encode(), hashlib.sha256).digest()
                sign = urllib.parse.quote_plus(base64.b64encode(digest))
                url += ("&" if "?" in url else "?") + f"timestamp={stamp}&sign={sign}"
        elif self.kind == "feishu":
            body = {"msg_type": "text", "content": {"text": text}}
            if self.secret:
                stamp = str(int(now))
                digest = hmac.new(f"{stamp}\n{self.secret}".encode(), b"", hashlib.sha256).digest()
                body.update(timestamp=stamp, sign=base64.b64encode(digest).decode())
        else:  # wecom: the key is in the URL
            body = {"msgtype": "text", "text": {"content": text}}
        return url, json.dumps(body, ensure_ascii=False).encode()

    def send(self, message: dict[str, Any]) -> bool:
        url, body = self.request(message, time.time())
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                response.read()
            return True
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "code", None) or type(exc).__name__
            log.warning("alert not delivered to %s: %s", self.describe(), reason)
            return False


def parse_notifier(kind: str, url: str, secret: str | None = None, lang: str = "en") -> Notifier:
    if kind not in KINDS:
        raise UsageError(f"unknown notifier kind {kind!r} (use one of {', '.join(KINDS)})",
                         f"未知的通知类型 {kind!r}（可用：{', '.join(KINDS)}）")  # fmt: skip
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"invalid {kind} webhook URL: it must start with https:// and name a host",
                         f"{kind} webhook 地址无效：必须以 https:// 开头并包含主机名")  # fmt: skip
    return Notifier(kind, url, secret, lang)


def from_flag(value: str) -> Notifier:
    kind, sep, url = value.partition("=")
    if not sep:
        raise UsageError("--notify takes KIND=URL, e.g. --notify slack=https://hooks.slack.com/services/...",
                         "--notify 的格式为 KIND=URL，例如 --notify slack=https://hooks.slack.com/services/...")  # fmt: skip
    return parse_notifier(kind.strip(), url.strip())


def from_config(path: str) -> list[Notifier]:
    """``[[notify]]`` tables of kind, url, secret, lang. Unknown keys are refused, not ignored."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(
            f"cannot read config {path}: {exc.strerror}", f"无法读取配置文件 {path}：{exc.strerror}"
        ) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"config {path} is not valid TOML: {exc}", f"配置文件 {path} 不是有效的 TOML：{exc}") from exc
    unknown_top = set(raw) - {"notify"}
    if unknown_top:
        raise UsageError(
            f"config {path}: unknown key {sorted(unknown_top)[0]!r}",
            f"配置文件 {path}：未知的键 {sorted(unknown_top)[0]!r}",
        )
    notifiers = []
    for entry in raw.get("notify", []):
        unknown = set(entry) - _KEYS
        if unknown:
            raise UsageError(f"config {path}: unknown key {sorted(unknown)[0]!r} in [[notify]]",
                             f"配置文件 {path}：[[notify]] 中有未知的键 {sorted(unknown)[0]!r}")  # fmt: skip
        if "kind" not in entry or "url" not in entry:
            raise UsageError(
                f"config {path}: every [[notify]] needs kind and url",
                f"配置文件 {path}：每个 [[notify]] 都需要 kind 和 url",
            )
        notifiers.append(parse_notifier(entry["kind"], entry["url"], entry.get("secret"), entry.get("lang", "en")))
    return notifiers


def to_record(notifiers: list[Notifier]) -> list[dict[str, str]]:
    """How notifiers are kept in the run record (the supervisor needs the secrets; status never shows them)."""
    return [{"kind": n.kind, "url": n.url, "secret": n.secret or "", "lang": n.lang} for n in notifiers]


def from_record(items: list[dict[str, str]]) -> list[Notifier]:
    return [Notifier(i["kind"], i["url"], i.get("secret") or None, i.get("lang", "en")) for i in items]
