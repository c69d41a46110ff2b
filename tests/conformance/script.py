"""The Python script agent's steps: each interprets its list of operations from the run's
input (``input["script"]``, a scenario of ``conformance/scenarios/``), through the public
``ctx`` API only, so the same steps run on every Python backend. Its TypeScript twin is
``clients/typescript/test/conformance.mjs``; docs/conformance.md describes the operations.

No Django and no client package here: ``script_client.py`` (the HTTP worker) and
``script_runtime.py`` (the server's own runtime) wrap these steps in their ``Agent`` and
give the folder tool its result types.

The scenario's folder (``HOLDPOINT_CONFORMANCE_DIR``) is shared with the driver: the
journal of marks (``journal.log``, one ``name@attempt`` a line), the files ``busy`` waits
for, and the folder tool's "external system" (one file per idempotency key;
``executions.log``, one line per act).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STEPS = ("one", "two", "three", "four")
TOOL = "conf-folder"


def folder() -> Path:
    return Path(os.environ["HOLDPOINT_CONFORMANCE_DIR"])


def note(mark: str) -> None:
    # One short line with O_APPEND: lines of several processes do not interleave.
    with (folder() / "journal.log").open("a", encoding="utf-8") as journal:
        journal.write(mark + "\n")


def _busy(op: dict[str, Any]) -> None:
    gate = folder() / op["until"]
    deadline = time.monotonic() + float(op.get("limit", 60))
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _key(op: dict[str, Any]) -> dict[str, Any]:
    return {"key": op["key"]} if "key" in op else {}


def _approval(approval: Any) -> dict[str, Any]:
    return {
        "approved": bool(approval.approved),
        "decision": approval.decision,
        "comment": approval.comment,
        "edited": approval.edited,
    }


def _sleep(ctx: Any, op: dict[str, Any]) -> float:
    began = time.monotonic()
    ctx.sleep(float(op["seconds"]))
    return round(time.monotonic() - began, 3)


OPS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "ask": lambda ctx, op: ctx.ask(op["prompt"], op["schema"], **_key(op)),
    "approve": lambda ctx, op: _approval(
        ctx.approve(
            op["action"],
            op["target"],
            op["change"],
            **_key(op),
            **({"editable": op["editable"]} if "editable" in op else {}),
            **({"arguments": op["arguments"]} if "arguments" in op else {}),
        )
    ),
    "side_effect": lambda ctx, op: (
        lambda done: {"decision": done.decision, "external_reference": done.external_reference}
    )(ctx.side_effect(TOOL, op["target"], op["request"], **_key(op))),
    "sleep": _sleep,
    "log": lambda ctx, op: ctx.log(op["message"]),
    "mark": lambda ctx, op: note(f"{op['name']}@{ctx.attempt_number}"),
    "busy": lambda ctx, op: _busy(op),
}


def run_step(name: str, ctx: Any, state: Any) -> Any:
    """Run step ``name``'s operations, then go to the script's next step or return the
    state (every saved value) as the result."""
    script = ctx.input["script"]
    state = dict(state or {})
    for op in script[name]:
        value = OPS[op["op"]](ctx, op)
        if "save" in op:
            state[op["save"]] = value
    later = [step for step in STEPS[STEPS.index(name) + 1 :] if step in script]
    return ctx.next(later[0], state) if later else ctx.done(state)


def step_function(name: str) -> Callable[[Any, Any], Any]:
    def step(ctx: Any, state: Any) -> Any:
        return run_step(name, ctx, state)

    step.__name__ = name
    return step


class Folder:
    """The folder tool's external system: acts once per idempotency key, looks keys up."""

    @staticmethod
    def _path(key: str) -> Path:
        return folder() / f"effect-{key.replace('/', '_')}.json"

    def act(self, request: Any, key: str) -> tuple[str, Any]:
        self._path(key).write_text(json.dumps(request))
        with (folder() / "executions.log").open("a", encoding="utf-8") as log:
            log.write(f"{key} {os.getpid()}\n")
        hang = float((request or {}).get("hang_after_act", 0))
        if hang:
            note("acted")
            if self.hang:  # the harness crashes by itself, at the key
                time.sleep(hang)  # the window between the act and its recorded outcome
        return f"folder:{key}", {"written": True}

    def look(self, key: str) -> str | None:
        return f"folder:{key}" if self._path(key).exists() else None

    def __init__(self, *, hang: bool = True) -> None:
        self.hang = hang
