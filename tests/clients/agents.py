"""Remote agents for the client tests: written against ``holdpoint_client`` only (no
Django), served by a worker in the test process or by ``holdpoint-worker`` processes.

The "external system" is a folder (``HOLDPOINT_TEST_TOOL_DIR``): ``FolderTool`` writes one
file per idempotency key and appends each execution to ``executions.log``, so a test can
count how often the world was really touched.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from holdpoint_client import (
    Agent,
    ApprovalDenied,
    Context,
    Done,
    Next,
    Outcome,
    RetryPolicy,
    ToolResult,
)


class FolderTool:
    name = "folder"
    reversibility = "compensable"

    @property
    def root(self) -> Path:
        return Path(os.environ["HOLDPOINT_TEST_TOOL_DIR"])

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        target = self.root / f"{idempotency_key.replace('/', '_')}.json"
        target.write_text(json.dumps(request))
        with (self.root / "executions.log").open("a") as log:
            log.write(f"{idempotency_key} {os.getpid()}\n")
        hang = self.root / "hang-after-execute"
        if hang.exists():
            hang.unlink()  # Once: the test kills this process now, before the outcome is sent.
            (self.root / "hanging").write_text(str(os.getpid()))
            time.sleep(3600)
        return ToolResult(external_reference=f"folder:{target.name}", result={"written": True})

    def lookup(self, idempotency_key: str) -> Outcome | None:
        target = self.root / f"{idempotency_key.replace('/', '_')}.json"
        if not target.exists():
            return None
        return Outcome(status="confirmed", external_reference=f"folder:{target.name}")


deploy = Agent(
    name="remote-deploy",
    input_schema={"service": "string"},
    label="Deploy {service}",
    description="A remote agent: asks, observes, approves, writes once",
    tools=[FolderTool()],
    retry=RetryPolicy(max_attempts=5, backoff_initial=0.1, backoff_max=0.5),
)


def _config_version() -> int:
    path = Path(os.environ["HOLDPOINT_TEST_TOOL_DIR"]) / "config-version"
    return int(path.read_text()) if path.exists() else 1


@deploy.step(start=True)
def plan(ctx: Context, state: dict[str, Any]) -> Next:
    version = ctx.observe("config", _config_version)
    answer = ctx.ask("Which versions?", {"versions": "string[]"})
    ctx.log("planned", versions=answer["versions"])
    ctx.cost("0.5")
    return ctx.next(
        "apply",
        {"versions": answer["versions"], "config": version, "changed": ctx.changed("config")},
    )


@deploy.step
def apply(ctx: Context, state: dict[str, Any]) -> Done | Next:
    approval = ctx.approve(
        "deploy", ctx.input["service"], {"versions": {"from": [], "to": state["versions"]}}
    )
    if approval.denied:
        return ctx.done({"deployed": False, "by": approval.answered_by})
    done = ctx.side_effect("folder", ctx.input["service"], {"versions": state["versions"]})
    if os.environ.get("HOLDPOINT_TEST_LINGER"):
        ctx.sleep(float(os.environ["HOLDPOINT_TEST_LINGER"]))  # A worker kill lands here.
    return ctx.next("report", {**state, "reference": done.external_reference})


@deploy.step
def report(ctx: Context, state: dict[str, Any]) -> Done:
    return ctx.done({"deployed": True, "agent_version": ctx.agent_version, **state})


looper = Agent(name="remote-loop", description="Loops in small steps until told to stop")


@looper.step(start=True)
def spin(ctx: Context, state: dict[str, Any]) -> Next | Done:
    n = int(state.get("n", 0))
    if n >= int(ctx.input.get("steps", 1000)):
        return ctx.done({"n": n})
    ctx.sleep(float(ctx.input.get("pause", 0.2)))
    return ctx.next("spin", {"n": n + 1})


waiter = Agent(
    name="remote-wait-act",
    description="Waits, then acts once",
    tools=[FolderTool()],
    retry=RetryPolicy(max_attempts=5, backoff_initial=0.1, backoff_max=0.5),
)


@waiter.step(start=True)
def wait_then_act(ctx: Context, state: dict[str, Any]) -> Done:
    ctx.sleep(float(ctx.input.get("wait", 4)))  # A worker frozen here wakes with a stale lease.
    done = ctx.side_effect("folder", "target", {"from": os.getpid()})
    return ctx.done({"reference": done.external_reference, "pid": os.getpid()})


class SendOnceTool(FolderTool):
    """The folder as an irreversible tool whose calls an approver may edit (``edit_schema``)."""

    name = "folder-once"
    reversibility = "irreversible"
    edit_schema = {"to": "string", "body": "string"}


tuner = Agent(
    name="remote-tune",
    input_schema={"service": "string"},
    description="Approves an editable change (or is sent back), then sends one irreversible note",
    tools=[SendOnceTool()],
    retry=RetryPolicy(max_attempts=3, backoff_initial=0.1, backoff_max=0.5),
)


@tuner.step(start=True)
def tune(ctx: Context, state: dict[str, Any]) -> Done | Next:
    plan = {"timeout": 30, "retries": 2}
    approval = ctx.approve(
        "tune",
        ctx.input["service"],
        {"timeout": {"from": 10, "to": 30}},
        editable={"timeout": "integer", "retries": "integer"},
        arguments=plan,
    )
    if approval.responded:
        return ctx.done({"responded": approval.comment, "approved": approval.approved})
    if approval.denied:
        return ctx.done({"denied": True})
    return ctx.next(
        "notify",
        {"settings": approval.edited or plan, "edited": approval.edited is not None},
    )


@tuner.step
def notify(ctx: Context, state: dict[str, Any]) -> Done:
    request = {"to": "ops", "body": f"timeout={state['settings']['timeout']}"}
    try:
        done = ctx.side_effect("folder-once", ctx.input["service"], request)
    except ApprovalDenied as exc:
        return ctx.done({**state, "sent": False, "why": str(exc)})
    return ctx.done({**state, "sent": True, "reference": done.external_reference})


AGENTS = [deploy, looper, waiter, tuner]
