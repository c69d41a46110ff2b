"""One agent runtime on three backends (issue 26): the SDK imports without Django, the
harness keeps time as a worker does, and every safe point (``ctx.log``, ``next``, ``done``
included) stops a cancelled or overdue step on every backend."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from holdpoint_client import Agent as SdkAgent
from holdpoint_client.control import AttemptControl, CancelRequested, StepTimeout
from holdpoint_client.testing import FakeClock, FakeContext, FakeTool, run_agent

ROOT = Path(__file__).resolve().parents[2]


def _without_django(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_imports_the_sdk_without_django_configured(tmp_path: Path) -> None:
    done = _without_django(
        """
        import sys
        import runtime.sdk
        from runtime.sdk import Agent, Context, Done, Next, RetryPolicy
        assert "runs.models" not in sys.modules, "the SDK loaded the run store"
        print("imported")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_the_sdk_package_imports_no_django(tmp_path: Path) -> None:
    done = _without_django(
        """
        import pkgutil, importlib, sys
        import holdpoint_client
        for module in pkgutil.iter_modules(holdpoint_client.__path__):
            if module.name not in ("demo_graph", "demo_openai_agents", "langgraph", "cli"):
                importlib.import_module(f"holdpoint_client.{module.name}")
        assert not [m for m in sys.modules if m == "django" or m.startswith("django.")]
        print("clean")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"


def test_an_agent_and_its_test_run_on_the_harness_without_django(tmp_path: Path) -> None:
    (tmp_path / "greeter.py").write_text(
        textwrap.dedent(
            """
            from runtime.sdk import Agent, Context

            greeter = Agent(name="greeter-no-django", input_schema={"name": "string"})

            @greeter.step(start=True)
            def ask(ctx: Context, state: dict):
                tone = ctx.ask("Which tone?", {"tone": "string"})
                ctx.log("asked", tone=tone["tone"])
                return ctx.next("send", {"tone": tone["tone"]})

            @greeter.step
            def send(ctx: Context, state: dict):
                done = ctx.side_effect("notify", ctx.input["name"], {"tone": state["tone"]})
                return ctx.done({"sent": done.external_reference})
            """
        )
    )
    done = _without_django(
        """
        import sys
        from greeter import greeter
        from holdpoint_client.testing import FakeTool, run_agent

        notify = FakeTool("notify")
        run = run_agent(greeter, {"name": "ada"}, answers=[{"tone": "warm"}],
                        tools={"notify": notify}, crash_after="send.notify")
        assert run.status == "succeeded", run.error
        assert run.result == {"sent": "notify-1"}
        assert len(notify.performed) == 1 and notify.lookups, notify.lookups
        from django.conf import settings
        assert not settings.configured and "runs.models" not in sys.modules
        print("ok")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _timed(timeout: float) -> tuple[SdkAgent, FakeTool, FakeClock]:
    clock = FakeClock()
    slow = FakeTool("slow", takes=timeout * 2)
    agent = SdkAgent(name="slow-step", tools=[slow])

    @agent.step(start=True, timeout=timeout)
    def act(ctx: Any, state: Any) -> Any:
        done = ctx.side_effect("slow", "there", {"n": 1})
        return ctx.done(done.decision)

    return agent, slow, clock


def test_a_tool_that_outlasts_the_step_timeout_times_out_in_the_harness_as_on_a_worker() -> None:
    agent, slow, clock = _timed(5.0)
    run = run_agent(agent, tools={"slow": slow}, clock=clock)
    # The outcome is recorded, then the step stops at the safe point after it (StepTimeout,
    # transient); the retry reuses the recorded effect and never acts again.
    first, second = run.attempts
    assert first.error is not None and first.error["type"] == "StepTimeout"
    assert first.error["class"] == "transient"
    assert run.side_effects["act.slow"].status == "confirmed"
    assert (run.status, run.result, len(slow.calls)) == ("succeeded", "reuse", 1)
    assert second.status == "succeeded"


@pytest.mark.parametrize("ending", ["log", "done", "next"])
def test_a_step_past_its_deadline_stops_at_log_done_and_next_in_the_harness(ending: str) -> None:
    clock = FakeClock()
    agent = SdkAgent(name=f"overdue-{ending}", retry=None)
    reached: list[str] = []

    @agent.step(start=True, timeout=5.0)
    def work(ctx: Any, state: Any) -> Any:
        if ctx.attempt_number == 1:
            clock.advance(6.0)  # work that took longer than the step may
        if ending == "log":
            ctx.log("still here")
        result = ctx.done("ok") if ending != "next" else ctx.next("end", {})
        reached.append(ending)
        return result

    @agent.step
    def end(ctx: Any, state: Any) -> Any:
        return ctx.done("ok")

    run = run_agent(agent, clock=clock)
    assert run.attempts[0].error is not None
    assert run.attempts[0].error["type"] == "StepTimeout"
    assert run.status == "succeeded" and reached == [ending]  # only the retry got there


def test_a_lone_fake_context_stops_at_log_past_its_deadline() -> None:
    clock = FakeClock()
    ctx = FakeContext(step="plan", timeout=1.0, clock=clock)
    ctx.log("in time")
    clock.advance(2.0)
    with pytest.raises(StepTimeout):
        ctx.log("too late")
    assert [line["message"] for line in ctx.logs] == ["in time"]


def _remote_ctx(timeout: float | None = None) -> tuple[Any, AttemptControl]:
    from holdpoint_client.context import Context
    from holdpoint_client.http import Api
    from holdpoint_client.remote import HttpBackend, RemoteControl

    lease = {
        "run_id": "run_x",
        "attempt_id": "att_x",
        "agent": "remote",
        "number": 1,
        "reason": "initial",
        "input": {},
        "lease_seconds": 60,
        "lease_epoch": 1,
        "cancel_epoch": 0,
    }
    # No server answers here: each safe point below must stop the step before any write.
    control = RemoteControl(Api("http://127.0.0.1:9", "token"), lease, threading.Event())
    ctx = Context(
        backend=HttpBackend(SdkAgent(name="remote"), control),
        step="work",
        checkpoint_id="cp_x",
        answers={},
        resumed=False,
        timeout=timeout,
    )
    return ctx, control


@pytest.mark.parametrize("call", ["log", "done", "next"])
def test_over_http_log_done_and_next_stop_after_cancel_and_past_the_deadline(call: str) -> None:
    def safe_point(ctx: Any) -> None:
        if call == "log":
            ctx.log("x")
        elif call == "done":
            ctx.done(1)
        else:
            ctx.next("other", {})

    ctx, control = _remote_ctx()
    control.request_cancel("test")
    with pytest.raises(CancelRequested):
        safe_point(ctx)
    ctx, control = _remote_ctx(timeout=0.05)
    time.sleep(0.1)
    with pytest.raises(StepTimeout):
        safe_point(ctx)


def test_one_retry_policy_for_the_run_store_the_clients_and_the_harness() -> None:
    """The run store judges a client agent's failures by the very class the client sends
    (``holdpoint_client/types.py``): what the server would refuse, the client refuses when
    the agent is written, and the harness backs off as the server does."""
    from holdpoint_client import RetryPolicy

    from runs.agents import RetryPolicy as StorePolicy

    assert StorePolicy is RetryPolicy
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    policy = RetryPolicy(
        max_attempts=3, backoff_initial=2.0, jitter=0.0, repeated_error_threshold=4
    )
    assert [policy.backoff_seconds(n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert RetryPolicy.from_dict(policy.as_dict()) == policy

    agent = SdkAgent(name="always-fails", retry=policy)

    @agent.step(start=True)
    def fail(ctx: Any, state: Any) -> Any:
        raise RuntimeError("down")

    run = run_agent(agent)
    assert run.status == "failed" and run.failure_class == "transient"
    assert run.clock.backoffs == [2.0, 4.0]
