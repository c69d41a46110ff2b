"""The examples of docs/agents.md run as written (issue 26): the code blocks are read out
of the page and executed, with only what the page says is the reader's own supplied
(``list_signing_keys``, ``tickets``, ``read_config_version``). A change to the SDK that
breaks an example fails here, not in a newcomer's first hour."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import registry

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def block_after(heading: str) -> str:
    """The first ```python block after ``heading`` (a line of the page)."""
    text = PAGE.read_text()
    start = text.index(f"\n{heading}\n")
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found is not None, f"no python block after {heading!r}"
    return found.group(1)


def run_block(heading: str, **given: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"docs_agents_{abs(hash(heading))}", **given}
    exec(compile(block_after(heading), f"{PAGE}:{heading}", "exec"), namespace)
    return namespace


@pytest.fixture
def unregister() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        registry.unregister(name)


def test_the_first_example_agent_runs_in_the_harness(unregister: list[str]) -> None:
    from runtime.testing import run_agent

    keys = {"billing": ["k1", "k2"]}
    example = run_block("## Writing an agent", list_signing_keys=lambda service: keys[service])
    agent = example["agent"]
    unregister.append(agent.name)
    assert registry.get_agent("rotate-keys") is agent

    run = run_agent(
        agent, {"service": "billing"}, answers=[{"keep": ["k2"]}], approvals=["approve"]
    )
    assert run.status == "succeeded", run.error
    assert run.result == {"kept": ["k2"]}
    assert run.questions[0].context["keys"] == ["k1", "k2"]
    assert [log["message"] for log in run.logs if log.get("level") == "info"] == ["rotating"]

    denied = run_agent(agent, {"service": "billing"}, answers=[{"keep": ["k1"]}], approvals=[False])
    assert (denied.status, denied.failure_class) == ("failed", "deterministic")


def test_the_harness_example_runs_as_written() -> None:
    tests = run_block("## Testing an agent")
    names = [name for name in tests if name.startswith("test_")]
    assert names == [
        "test_a_crash_between_the_act_and_the_record_never_sends_twice",
        "test_it_waits_for_a_tone",
    ]
    for name in names:
        tests[name]()


def test_the_remote_example_runs_in_the_harness_unchanged() -> None:
    """The page's ``agents/deploy.py`` (written against the client package) in the
    client's harness, with the reader's ticket system and config reader supplied."""
    from holdpoint_client.testing import FakeTool, run_agent

    class Tickets:
        def __init__(self) -> None:
            self.made: dict[str, str] = {}

        def create(self, request: Any, *, idempotency_key: str) -> str:
            return self.made.setdefault(idempotency_key, f"TCK-{len(self.made) + 1}")

        def find(self, idempotency_key: str) -> str | None:
            return self.made.get(idempotency_key)

    tickets = Tickets()
    example = run_block(
        "## Remote agents: the Python client",
        tickets=tickets,
        read_config_version=lambda: 3,
    )
    deploy = example["deploy"]
    hook = FakeTool("webhook", reversibility="irreversible")
    run = run_agent(
        deploy,
        {"service": "gateway"},
        answers=[{"versions": ["v2"]}],
        # apply's approval, the ticket's (ask_before), the webhook's (irreversible)
        approvals=["approve", "approve", "approve"],
        tools={"webhook": hook, "ticket": deploy.tools["ticket"]},  # the reader's own
        crash_after="apply.ticket",
    )
    assert run.status == "succeeded", run.error
    assert run.result == {"deployed": True, "ticket": "TCK-1"}
    assert len(tickets.made) == 1 and len(hook.performed) == 1
    # reuse: the webhook's approval ends the attempt, and apply runs once more
    assert run.side_effects["apply.ticket"].decisions == ["act", "look_up", "reuse"]
