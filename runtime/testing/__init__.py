"""Test an agent without a server: the agent SDK's harness (``holdpoint_client.testing``:
the one runtime on an in-memory store and a fake clock) with the server's own rules.

::

    from runtime.testing import FakeTool, run_agent

    def test_it_sends_once_even_if_the_worker_dies_between_act_and_record():
        hook = FakeTool("webhook", reversibility="irreversible")
        run = run_agent(
            agent,
            {"customer": "acme"},
            answers=[{"tone": "firm"}],
            approvals=["approve"],
            tools={"webhook": hook},
            crash_after="send.webhook",
        )
        assert run.status == "succeeded"
        assert len(hook.performed) == 1

The steps run on the same ``ctx`` and executor as on a worker (``holdpoint_client``), so
checkpoints, hold points, what people approved, the ledger's decisions, the safe points
and step deadlines are the worker's own. What this module adds are the run store's rules
(``ServerRules``): inputs and answers checked against their JSON Schema
(``runs/schemas.py``), each tool's request schema (``ledger/tools``), an approval's answer
(``runs/approvals.py``), the failure classes and fingerprints (``runs/services``), and the
lease-loss cap (``HOLDPOINT_MAX_LEASE_LOSSES``). Tools the test does not give in ``tools``
are a ``FakeTool`` of the same name, reversibility and request schema: no test sends a
real e-mail or webhook by accident.

What is not here: the database, leases, heartbeats, cancel, pause, people's retries. A
test that needs them drives a real worker (``runtime.executor.execute``).
"""

from __future__ import annotations

from typing import Any

from holdpoint_client import testing as sdk_testing
from holdpoint_client.backend import Refused
from holdpoint_client.testing import (
    Crash,
    FakeClock,
    FakeContext,
    FakeTool,
    HarnessError,
    Question,
    Rules,
    RunResult,
    SideEffectRecord,
)

__all__ = [
    "Crash",
    "FakeClock",
    "FakeContext",
    "FakeTool",
    "HarnessError",
    "Question",
    "RunResult",
    "ServerRules",
    "SideEffectRecord",
    "run_agent",
]


class ServerRules(Rules):
    """The run store's and the ledger's rules, for the in-memory harness."""

    def __init__(self) -> None:
        from django.conf import settings

        self.max_lease_losses = int(settings.HOLDPOINT_MAX_LEASE_LOSSES)

    def check_input(self, agent: Any, value: Any) -> None:
        from runs.schemas import compile_schema, validate_value

        if agent.input_schema:
            validate_value(compile_schema(agent.input_schema), value, what="input")

    def check_answer(self, question: Question, value: Any) -> Any:
        from runs.schemas import compile_schema, validation_errors

        errors = validation_errors(compile_schema(question.schema or {}), value)
        if errors:
            raise HarnessError(
                f"The answer {value!r} to {question.key!r} does not fit its schema: "
                + "; ".join(f"{e['pointer']}: {e['message']}" for e in errors)
            )
        return value

    def check_approval(self, question: Question, value: dict[str, Any]) -> dict[str, Any]:
        """The run store's rule for an approval's answer (``runs/approvals.py``): comment
        required to deny or send back, an edit only of what is offered and fitting its
        schema, an edit equal to the plan a plain approval."""
        from runs.approvals import approval_answer
        from runs.errors import HoldpointError
        from runs.schemas import compile_schema

        action = dict(question.action or {})
        if isinstance(action.get("editable"), dict):
            action["editable"] = {
                **action["editable"],
                "schema": compile_schema(action["editable"].get("schema")),
            }
        try:
            return dict(approval_answer(action, value))
        except HoldpointError as exc:
            errors = exc.extra.get("errors") or []
            raise HarnessError(
                f"The approval {value!r} of {question.key!r} does not fit: {exc.detail} "
                + "; ".join(f"{e['pointer']}: {e['message']}" for e in errors)
            ) from None

    def tool_like(self, agent: Any, name: str) -> Any:
        from ledger.tools import get_tool
        from runs.errors import HoldpointError

        try:
            return FakeTool.like(get_tool(name))
        except HoldpointError as exc:
            raise Refused(exc.code, exc.detail) from exc

    def request_errors(self, tool: Any, request: Any) -> list[dict[str, str]]:
        from ledger.tools import request_errors

        return request_errors(tool, request)

    def classify(self, error_class: str | None, error_type: str, policy: Any) -> str:
        from runs.services.failures import classify

        return classify(error_class, error_type, policy)

    def fingerprint(self, *, error_type: str, message: str, step: str) -> str:
        from runs.services import error_fingerprint

        return error_fingerprint(error_type=error_type, message=message, step=step)

    def policy_for(self, agent: Any, step: str) -> Any:
        from holdpoint_client import Agent

        from runtime.registry import agent_spec

        if isinstance(agent, Agent):  # The run store's rule (``AgentSpec.policy_for``).
            return agent_spec(agent).policy_for(step)
        return super().policy_for(agent, step)

    def idempotency_key(self, *, step_id: str, tool: str) -> str:
        from ledger.services import idempotency_key_for

        return idempotency_key_for(run_id="run_test", step_id=step_id, tool=tool)


def run_agent(agent: Any, input: Any = None, **options: Any) -> RunResult:
    """``holdpoint_client.testing.run_agent`` with the server's rules (``ServerRules``);
    the options (``answers``, ``approvals``, ``preapproved``, ``tools``, ``crash_after``,
    ``clock``, ``seed``, ``max_attempts``) are documented there and in docs/agents.md."""
    return sdk_testing.run_agent(agent, input, rules=ServerRules(), **options)
