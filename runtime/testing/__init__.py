"""Test an agent without a server: ``run_agent`` runs its steps in memory with the rules.

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

What is the same as on a worker (``runtime/executor.py``, ``runtime/context.py``,
``runs/services/failures.py``, ``ledger/services/intents.py``):

- a checkpoint before the first step and after every ``ctx.next``; a step is what runs
  again (after an answer, a failure or a crash), from its checkpoint's state, as JSON;
- hold points: ``ask`` / ``approve`` (and the approval an irreversible tool needs) end the
  attempt; the next answer in ``answers`` / ``approvals`` is given and the step runs again
  from its checkpoint, where the same call (same key) returns it. With no answer left the
  run stops there: ``status`` is ``input_required`` or ``auth_required``;
- the ledger's decision table (act, look up, reuse, refuse) by the record's status, with
  the ledger's idempotency keys; a request is checked against the tool's schema;
- failures classified by the agent's ``RetryPolicy`` (transient, deterministic, repeated
  error, the retry budget, the cost budget), backing off on a fake clock (``run.clock``)
  instead of waiting; ``ctx.sleep`` advances the clock too;
- ``crash_after``: the worker dies (SIGKILL) once at that point, and a new attempt goes
  on from the last checkpoint, as after a lease runs out. A step name crashes after the
  step returned and before its checkpoint is saved (so the step runs again); a side
  effect's key (``send.webhook``, ``send.notice``) crashes after the tool acted and before
  the outcome is recorded (so the ledger looks the key up).

What is not here: the database, leases, heartbeats, cancel, pause, people's retries. A
test that needs them drives a real worker (``runtime.executor.execute``).

Tools the test does not give in ``tools`` are replaced by a ``FakeTool`` of the same name,
reversibility and request schema: no test sends a real e-mail or webhook by accident.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runs.schemas import compile_schema
from runtime.context import to_json
from runtime.testing.context import FakeContext
from runtime.testing.fakes import (
    Crash,
    FakeClock,
    FakeTool,
    HarnessError,
    Question,
    RunResult,
    SideEffectRecord,
    _as_json,
)
from runtime.testing.run import _Run

__all__ = [
    "Crash",
    "FakeClock",
    "FakeContext",
    "FakeTool",
    "HarnessError",
    "Question",
    "RunResult",
    "SideEffectRecord",
    "run_agent",
]


def run_agent(
    agent: Any,
    input: Any = None,
    *,
    answers: Iterable[Any] = (),
    approvals: Iterable[Any] = (),
    preapproved: Iterable[str] = (),
    tools: Mapping[str, Any] | None = None,
    crash_after: str | Iterable[str] = (),
    clock: FakeClock | None = None,
    seed: int = 0,
    max_attempts: int = 100,
) -> RunResult:
    """Run ``agent`` on ``input`` in memory until it succeeds, fails or waits for a person.

    ``answers``: the answers to its ``ask`` questions, in the order they are asked.
    ``approvals``: the decisions on its approvals (``ctx.approve`` and an irreversible
    tool's), in order: ``True``/``"approve"``, ``False``/``"deny"`` or ``{"decision":
    …, "comment": …}``. ``preapproved``: hold-point keys approved when the run was started
    (``approvals=[…]`` of ``run_start``). ``tools``: fakes by tool name (others are a
    ``FakeTool`` like the registered tool). ``crash_after``: a step name or a side effect's
    key (or several), where the worker dies once. ``seed``: the backoff jitter's.
    """
    from runs.schemas import validate_value

    input = _as_json(input)
    if agent.input_schema:
        validate_value(compile_schema(agent.input_schema), input, what="input")
    points = [crash_after] if isinstance(crash_after, str) else list(crash_after)
    run = _Run(
        agent,
        to_json(input if input is not None else {}, "input"),
        answers=answers,
        approvals=approvals,
        preapproved=preapproved,
        tools=tools or {},
        crash_after=points,
        clock=clock or FakeClock(),
        seed=seed,
    )
    result = run.run(max_attempts)
    if run.crash_points:
        raise HarnessError(
            f"crash_after {sorted(run.crash_points)} was never reached: no step of that name "
            "returned and no side effect of that key acted."
        )
    return result
