"""The scenarios in the in-memory harness (``runtime.testing.run_agent``): the people's
answers of the timeline are given to the harness in order, a ``crash`` is its
``crash_after`` at that key, and the facts are read off its ``RunResult``. Only scenarios
that need nothing but people and crashes run here (no leases, no control, no processes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.testing import run_agent
from tests.conformance.scenarios import Scenario
from tests.conformance.script_runtime import FolderTool
from tests.conformance.script_runtime import agent as script_agent


def run(scenario: Scenario, folder: Path) -> dict[str, Any]:
    answers: list[Any] = []
    approvals: list[Any] = []
    crashes: list[str] = []
    kind = ""
    for action in scenario.timeline:
        if action["do"] == "wait_request":
            kind = action["kind"]
        elif action["do"] == "answer":
            (answers if kind == "input_required" else approvals).append(action["value"])
        elif action["do"] == "crash":
            crashes.append(action["at"])
    result = run_agent(
        script_agent,
        {"script": scenario.script},
        answers=answers,
        approvals=approvals,
        tools={"conf-folder": FolderTool(hang=False)},
        crash_after=crashes,
    )
    return {
        "status": result.status,
        "result": result.result,
        "error": result.error,
        "requests": [
            {
                "kind": q.kind,
                "step_id": q.key,
                "status": "answered" if q.answered else "pending",
            }
            for q in result.questions
        ],
        "attempts": [{"reason": a.reason, "status": a.status} for a in result.attempts],
        "ledger": [{"step_id": key, "status": e.status} for key, e in result.side_effects.items()],
        "checkpoints": [step for step, _state in result.checkpoints],
        "executions": executions(folder),
        "marks": marks(folder),
    }


def marks(folder: Path) -> list[str]:
    journal = folder / "journal.log"
    return journal.read_text().splitlines() if journal.exists() else []


def executions(folder: Path) -> int:
    log = folder / "executions.log"
    return len(log.read_text().splitlines()) if log.exists() else 0
