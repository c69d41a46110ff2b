"""Which rule a call gets: the server keeps the rules (people set and confirm them on the
agent's page); the gateway asks for them and applies them here, call by call.

- ``pass``: a read; called at once, not in the ledger.
- ``record``: a side effect in the ledger, made without asking.
- ``approve``: a side effect in the ledger, made only with an approval of exactly this
  call (the ledger itself refuses it otherwise).

A tool nobody has confirmed is ``approve`` (the server answers so); a tool the server does
not know, or an answer that cannot be read, is ``approve`` too.
"""

from __future__ import annotations

import fnmatch
import json
import threading
import time
from typing import Any

RULES = ("pass", "record", "approve")


def argument_text(value: Any) -> str:
    """What a pattern is matched against: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def rule_for(entry: dict[str, Any] | None, arguments: dict[str, Any]) -> str:
    """The rule of one call: the first pattern whose argument matches, else the tool's."""
    if not entry:
        return "approve"
    for pattern in entry.get("patterns") or []:
        name = pattern.get("argument")
        if name in arguments and fnmatch.fnmatchcase(
            argument_text(arguments[name]), str(pattern.get("matches", ""))
        ):
            rule = pattern.get("rule")
            return rule if rule in RULES else "approve"
    rule = entry.get("rule")
    return rule if rule in RULES else "approve"


class RuleBook:
    """The server's rules for this gateway's agent, asked again after ``ttl`` seconds."""

    def __init__(self, fetch: Any, ttl: float = 5.0) -> None:
        self._fetch = fetch
        self._ttl = ttl
        self._lock = threading.Lock()
        self._rules: dict[tuple[str, str], dict[str, Any]] = {}
        self._at = 0.0

    def replace(self, rules: list[dict[str, Any]]) -> None:
        with self._lock:
            self._rules = {
                (str(rule.get("server")), str(rule.get("name"))): rule
                for rule in rules
                if isinstance(rule, dict)
            }
            self._at = time.monotonic()

    def entry(self, server: str, tool: str) -> dict[str, Any] | None:
        if time.monotonic() - self._at > self._ttl:
            try:
                self.replace(self._fetch())
            except Exception:  # noqa: BLE001 - keep the last rules; unknown tools still ask
                with self._lock:
                    self._at = time.monotonic()
        with self._lock:
            return self._rules.get((server, tool))

    def rule(self, server: str, tool: str, arguments: dict[str, Any]) -> str:
        return rule_for(self.entry(server, tool), arguments)
