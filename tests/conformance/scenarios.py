"""The conformance scenarios (``conformance/scenarios/*.json``), checked against their
schema (``conformance/schema.json``) when loaded, and what the server recorded, checked
against a scenario's ``expect`` (docs/conformance.md).

``check`` compares one dict of facts with an ``expect``. Facts come from the run store
(``recorded``) or from the in-memory harness (``tests/conformance/harness.py``); a fact a
backend cannot know (the harness has no events) is absent, and what needs it is not
checked there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

ROOT = Path(__file__).resolve().parents[2] / "conformance"


@dataclass(frozen=True)
class Scenario:
    name: str
    data: dict[str, Any]

    @property
    def requires(self) -> set[str]:
        return set(self.data["requires"])

    @property
    def script(self) -> dict[str, Any]:
        return self.data["script"]

    @property
    def timeline(self) -> list[dict[str, Any]]:
        return self.data["timeline"]

    @property
    def expect(self) -> dict[str, Any]:
        return self.data["expect"]


@cache
def schema() -> dict[str, Any]:
    return json.loads((ROOT / "schema.json").read_text())


def problems(data: Any) -> list[str]:
    """What makes ``data`` not a scenario, as JSON pointers and messages."""
    validator = jsonschema.Draft202012Validator(schema())
    return [
        f"/{'/'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    ]


@cache
def load() -> tuple[Scenario, ...]:
    found = []
    for path in sorted((ROOT / "scenarios").glob("*.json")):
        data = json.loads(path.read_text())
        wrong = problems(data)
        if wrong:
            raise ValueError(f"{path.name} is not a valid scenario: {'; '.join(wrong)}")
        if data["name"] != path.stem:
            raise ValueError(f"{path.name}: its name is {data['name']!r}, not {path.stem!r}")
        found.append(Scenario(path.stem, data))
    return tuple(found)


def operations() -> set[str]:
    """The operation names the schema defines."""
    return {branch["properties"]["op"]["const"] for branch in schema()["$defs"]["op"]["oneOf"]}


def _subsequence(wanted: list[str], seen: list[str]) -> bool:
    remaining = iter(seen)
    return all(any(item == want for item in remaining) for want in wanted)


def _rows(wanted: list[dict[str, Any]], rows: list[dict[str, Any]]) -> bool:
    return len(wanted) == len(rows) and all(
        all(row.get(k) == v for k, v in want.items())
        for want, row in zip(wanted, rows, strict=True)
    )


def check(expect: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    """Every way ``facts`` differ from ``expect`` (empty: they agree)."""
    wrong: list[str] = []

    def differs(what: str, want: Any, got: Any) -> None:
        wrong.append(f"{what}: expected {json.dumps(want)}, recorded {json.dumps(got)}")

    if "status" in expect and facts["status"] != expect["status"]:
        differs("status", expect["status"], facts["status"])
    result = facts.get("result") if isinstance(facts.get("result"), dict) else {}
    for key, value in expect.get("result", {}).items():
        got = result.get(key)
        if isinstance(value, dict) and isinstance(got, dict):
            if any(got.get(k) != v for k, v in value.items()):
                differs(f"result.{key}", value, got)
        elif got != value:
            differs(f"result.{key}", value, got)
    for key, fields in expect.get("result_one_of", {}).items():
        got = result.get(key)
        if not isinstance(got, dict) or any(got.get(k) not in v for k, v in fields.items()):
            differs(f"result.{key} (one of)", fields, got)
    for key, least in expect.get("result_at_least", {}).items():
        got = result.get(key)
        if not isinstance(got, int | float) or got < least:
            differs(f"result.{key} (at least)", least, got)
    for name in ("requests", "attempts", "ledger"):
        if name in expect and name in facts and not _rows(expect[name], facts[name]):
            differs(name, expect[name], facts[name])
    if "error" in expect:
        message = (facts.get("error") or {}).get("message", "")
        if expect["error"]["message_contains"] not in message:
            differs("error message", expect["error"], facts.get("error"))
    if "events" in facts:
        if "events_in_order" in expect and not _subsequence(
            expect["events_in_order"], facts["events"]
        ):
            differs("events (in this order)", expect["events_in_order"], facts["events"])
        present = [e for e in expect.get("events_absent", []) if e in facts["events"]]
        if present:
            differs("events absent", expect["events_absent"], facts["events"])
    for name in ("checkpoints", "executions", "marks"):
        if name in expect and name in facts and facts[name] != expect[name]:
            differs(name, expect[name], facts[name])
    return wrong
