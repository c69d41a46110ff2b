"""The MCP gateway (``holdpoint_client.mcp_gateway``) against a live server: a real
downstream MCP server (the SDK's ``MCPServer``, in its own process), the gateway in its own
process, and a real MCP client session (``mcp.Client`` over Streamable HTTP).

A gated call is held for approval and made once, with the approver's edit; a client that
calls again gets the recorded result; a denial is a refusal the client reads; a gateway
SIGKILLed between the downstream call and its outcome leaves one execution, settled by the
downstream server's look-up (or by a person when it has none); a cancelled run makes no
more calls."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.authtoken.models import Token

from ledger.models import SideEffect
from runs import services
from runs.models import Run, RunEvent
from tests.clients.conftest import LEASE, answer, wait_for, wait_pending, wait_status
from tests.mcp_support import AGENT, Launcher, call, run_of, status_of, writes

try:
    import mcp  # noqa: F401
except ImportError:  # pragma: no cover - make install installs the extra
    if os.environ.get("CI"):
        raise
    pytest.skip("pip install './clients/python[mcp]'", allow_module_level=True)

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    root.mkdir()
    return root


@pytest.fixture
def launch(live_api, token: str, operator, tmp_path: Path, files: Path) -> Iterator[Launcher]:
    api_token = Token.objects.create(user=operator).key
    launcher = Launcher(tmp_path, files, live_api.url, token, api_token, LEASE)
    yield launcher
    launcher.stop()


@pytest.fixture
def downstream(launch: Launcher) -> Any:
    return launch.downstream


@pytest.fixture
def gateway(launch: Launcher) -> Any:
    return launch.gateway


def test_a_gated_call_waits_for_approval_and_runs_once_with_the_edit(
    downstream, gateway, approver, files: Path
) -> None:
    gw = gateway(downstream())
    planned = {"path": "notes.txt", "text": "draft"}
    first = call(gw, "files__write_file", planned, "s-edit")
    assert first.is_error and status_of(first) == "pending", first
    run = run_of("s-edit")
    card = wait_pending(run.id, "auth_required")
    # The card shows the exact call, editable against the tool's inputSchema.
    assert card.action["tool"] == "files__write_file"
    assert card.action["change"] == planned
    assert card.action["editable"]["value"] == planned
    assert set(card.action["editable"]["schema"]["properties"]) == {"path", "text"}
    assert writes(files) == []
    answer(run.id, card, {"decision": "approve", "edited": {**planned, "text": "final"}}, approver)

    # The same call again joins the decided request: the approved (edited) call's result.
    second = call(gw, "files__write_file", planned, "s-edit")
    assert not second.is_error, second
    assert second.structured_content == {"path": "notes.txt", "bytes": 5}
    assert (files / "notes.txt").read_text() == "final"
    third = call(gw, "files__write_file", planned, "s-edit")
    assert third.structured_content == second.structured_content
    assert [w["text"] for w in writes(files)] == ["final"]
    [effect] = SideEffect.objects.filter(run_id=run.id)
    assert effect.status == "confirmed" and effect.request == {**planned, "text": "final"}
    assert effect.reversibility == "irreversible"
    assert writes(files)[0]["key"] == effect.idempotency_key
    # What the server reported while it wrote is in the run's log; what it cost, in its cost.
    logs = RunEvent.objects.filter(run_id=run.id, type="agent.log")
    assert any("wrote 5 bytes to notes.txt" in str(e.payload) for e in logs), list(logs)
    assert Run.objects.get(pk=run.id).cost == Decimal("0.002")


def test_a_denied_call_is_refused_to_the_client_and_never_made(
    downstream, gateway, approver, files: Path
) -> None:
    gw = gateway(downstream())
    planned = {"path": "x.txt", "text": "no"}
    assert status_of(call(gw, "files__write_file", planned, "s-deny")) == "pending"
    run = run_of("s-deny")
    card = wait_pending(run.id, "auth_required")
    answer(run.id, card, {"decision": "deny", "comment": "not that file"}, approver)
    denied = call(gw, "files__write_file", planned, "s-deny")
    assert denied.is_error and status_of(denied) == "denied", denied
    assert "not that file" in denied.content[0].text
    assert writes(files) == []


def test_a_failing_tool_is_recorded_failed_and_the_client_reads_the_error(
    downstream, gateway, approver
) -> None:
    gw = gateway(downstream())
    assert status_of(call(gw, "files__fail", {"reason": "disk full"}, "s-fail")) == "pending"
    run = run_of("s-fail")
    answer(run.id, wait_pending(run.id, "auth_required"), {"decision": "approve"}, approver)
    failed = call(gw, "files__fail", {"reason": "disk full"}, "s-fail")
    assert failed.is_error and "disk full" in failed.content[0].text, failed
    [effect] = SideEffect.objects.filter(run_id=run.id)
    assert effect.status == "failed"


def test_a_cancelled_run_makes_no_more_calls(downstream, gateway, operator, files: Path) -> None:
    gw = gateway(downstream())
    planned = {"path": "c.txt", "text": "later"}
    assert status_of(call(gw, "files__write_file", planned, "s-cancel")) == "pending"
    run = run_of("s-cancel")
    wait_pending(run.id, "auth_required")
    services.run_cancel(run_id=run.id, user=operator)
    wait_status(run.id, "cancelled")
    again = call(gw, "files__write_file", planned, "s-cancel")
    assert again.is_error and status_of(again) == "cancelled", again
    other = call(gw, "files__read_file", {"path": "c.txt"}, "s-cancel")
    assert other.is_error and status_of(other) == "cancelled", other
    assert writes(files) == []


def _kill_mid_call(downstream, gateway, approver, files: Path, session: str, lookup: bool) -> Run:
    """Approve a write whose downstream call lingers after writing; SIGKILL the gateway
    while it waits for the outcome; start another gateway."""
    down = downstream(slow_write=60)
    gw = gateway(down, lookup=lookup)
    planned = {"path": "k.txt", "text": "once"}
    assert status_of(call(gw, "files__write_file", planned, session)) == "pending"
    run = run_of(session)
    answer(run.id, wait_pending(run.id, "auth_required"), {"decision": "approve"}, approver)
    wait_for(lambda: len(writes(files)) == 1, 60, "the downstream write")
    [effect] = SideEffect.objects.filter(run_id=run.id)
    assert effect.status == "pending"  # the call is made, its outcome not yet recorded
    gw.proc.send_signal(signal.SIGKILL)
    gw.proc.wait(10)
    gateway(down, lookup=lookup)

    def swept() -> bool:
        services.sweep_all()
        effect.refresh_from_db()
        return effect.status != "pending"

    wait_for(swept, 90, "the next attempt to settle the write")
    return run


def test_a_gateway_killed_between_the_call_and_its_outcome_looks_it_up_and_never_repeats_it(
    downstream, gateway, approver, files: Path
) -> None:
    run = _kill_mid_call(downstream, gateway, approver, files, "s-kill", lookup=True)
    [effect] = SideEffect.objects.filter(run_id=run.id)
    assert effect.status == "confirmed"
    assert effect.result == {"looked_up": {"path": "k.txt", "bytes": 4}}
    assert len(writes(files)) == 1
    # The session died with the first gateway: the run ends once the call is settled.
    wait_status(run.id, "succeeded", timeout=60)
    assert len(writes(files)) == 1


def test_without_a_look_up_the_lost_outcome_is_unknown_until_a_person_settles_it(
    downstream, gateway, approver, operator, files: Path
) -> None:
    run = _kill_mid_call(downstream, gateway, approver, files, "s-unknown", lookup=False)
    [effect] = SideEffect.objects.filter(run_id=run.id)
    assert effect.status == "unknown"
    wait_status(run.id, "failed", timeout=60)
    assert Run.objects.get(pk=run.id).failure_class == "side_effect_unknown"
    from ledger.services import side_effect_reconcile

    side_effect_reconcile(
        operation_id=effect.operation_id, outcome="confirmed", user=approver, note="file is there"
    )
    effect.refresh_from_db()
    assert effect.status == "confirmed"
    assert len(writes(files)) == 1


def test_a_client_with_a_progress_token_is_held_with_progress_until_the_decision(
    downstream, gateway, approver, files: Path
) -> None:
    """A client that asks for progress is held open (progress notifications name the
    request) and gets the result as soon as the call is approved and made."""
    import threading

    gw = gateway(downstream())
    planned = {"path": "p.txt", "text": "held"}
    notes: list[str] = []
    out: dict[str, Any] = {}

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    def held_call() -> None:
        out["result"] = call(
            gw, "files__write_file", planned, "s-progress", progress_callback=on_progress
        )

    caller = threading.Thread(target=held_call)
    caller.start()
    run = run_of("s-progress")
    card = wait_pending(run.id, "auth_required")
    wait_for(lambda: any(card.id in note for note in notes), 30, "a progress note")
    assert "out" not in out and caller.is_alive()  # still held, not answered "pending"
    answer(run.id, card, {"decision": "approve"}, approver)
    caller.join(60)
    assert not out["result"].is_error, out["result"]
    assert [w["text"] for w in writes(files)] == ["held"]


def test_a_paused_run_refuses_calls_until_it_is_continued(
    downstream, gateway, approver, operator, files: Path
) -> None:
    gw = gateway(downstream())
    first = {"path": "a.txt", "text": "one"}
    assert status_of(call(gw, "files__write_file", first, "s-pause")) == "pending"
    run = run_of("s-pause")
    answer(run.id, wait_pending(run.id, "auth_required"), {"decision": "approve"}, approver)
    assert not call(gw, "files__write_file", first, "s-pause").is_error
    # The run now waits in step serve for the session's next call: pause it there.
    wait_for(lambda: Run.objects.get(pk=run.id).status == "running", 30, "serve to run")
    services.run_pause(run_id=run.id, reason="look first", user=operator)
    wait_status(run.id, "paused")
    second = {"path": "b.txt", "text": "two"}
    refused = call(gw, "files__write_file", second, "s-pause")
    assert refused.is_error and status_of(refused) == "paused", refused
    assert [w["text"] for w in writes(files)] == ["one"]
    request = wait_pending(run.id, "pause")
    services.run_resume(
        run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id, user=operator
    )
    wait_for(lambda: Run.objects.get(pk=run.id).status == "running", 30, "serve again")
    assert status_of(call(gw, "files__write_file", second, "s-pause")) == "pending"


def test_over_stdio_a_client_that_starts_the_gateway_is_one_session(
    live_api, token: str, operator, approver, tmp_path: Path, files: Path, launch: Launcher
) -> None:
    """The client launches the gateway as its stdio server (as a desktop MCP client
    does); the gateway launches the downstream server over stdio in turn."""
    import anyio
    from mcp import Client, StdioServerParameters

    config = tmp_path / "stdio.toml"
    command = [sys.executable, "-m", "holdpoint_client.mcp_gateway.demo_server"]
    config.write_text(
        "\n".join(
            [
                'agent = "files-gateway"',
                f'holdpoint_url = "{live_api.url}"',
                "wait_seconds = 2",
                f"lease_seconds = {LEASE}",
                "[servers.files]",
                "command = ["
                + ", ".join(f'"{part}"' for part in command)
                + f', "--root", "{files}"]',
            ]
        )
    )
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "holdpoint_client.mcp_gateway.server", "--config", str(config), "--stdio"],
        env={
            **os.environ,
            "HOLDPOINT_WORKER_TOKEN": token,
            "HOLDPOINT_API_TOKEN": launch.api_token,
        },
    )
    planned = {"path": "s.txt", "text": "stdio"}
    seen: dict[str, Any] = {}

    async def session() -> None:
        async with Client(params) as client:
            seen["tools"] = sorted(t.name for t in (await client.list_tools()).tools)
            seen["first"] = await client.call_tool("files__write_file", planned)
            run = await anyio.to_thread.run_sync(lambda: Run.objects.get(agent="files-gateway"))
            card = await anyio.to_thread.run_sync(lambda: wait_pending(run.id, "auth_required"))
            await anyio.to_thread.run_sync(
                lambda: answer(run.id, card, {"decision": "approve"}, approver)
            )
            seen["second"] = await client.call_tool("files__write_file", planned)
            seen["run"] = run.id

    # In a thread of its own, as tests/mcp_support.py's calls: an earlier test of the
    # session may have left an event loop in this thread.
    failed: list[BaseException] = []

    def run() -> None:
        try:
            anyio.run(session)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    assert seen["tools"] == [
        "files__fail",
        "files__find_write",
        "files__read_file",
        "files__write_file",
    ]
    assert status_of(seen["first"]) == "pending"
    assert seen["second"].structured_content == {"path": "s.txt", "bytes": 5}
    assert [w["text"] for w in writes(files)] == ["stdio"]
    # The client closed stdin: the session ended, and so did its run.
    wait_status(seen["run"], "succeeded", timeout=60)


def test_a_team_rule_holds_the_call_until_the_second_approver_and_it_is_made_once(
    downstream, gateway, approver, files: Path
) -> None:
    """The agent's approval policy applies to gated calls as to any approval: with two
    approvers required, the first approval leaves the call waiting (a repeat still joins
    it), the second lets it through, once."""
    from runs.approvals import parse_policy
    from runs.models import AgentApprovalPolicy
    from tests.conftest import _user

    AgentApprovalPolicy.objects.update_or_create(
        agent=AGENT, defaults={"policy": parse_policy({"required": 2})}
    )
    second = _user("bruno", "approver")
    gw = gateway(downstream())
    planned = {"path": "team.txt", "text": "two"}
    assert status_of(call(gw, "files__write_file", planned, "s-team")) == "pending"
    run = run_of("s-team")
    card = wait_pending(run.id, "auth_required")
    answer(run.id, card, {"decision": "approve"}, approver)
    card.refresh_from_db()
    assert card.status == "pending"  # one of two
    assert status_of(call(gw, "files__write_file", planned, "s-team")) == "pending"
    assert writes(files) == []
    answer(run.id, card, {"decision": "approve"}, second)
    done = call(gw, "files__write_file", planned, "s-team")
    assert not done.is_error, done
    assert [w["text"] for w in writes(files)] == ["two"]
    [effect] = SideEffect.objects.filter(run_id=run.id)
    assert set(effect.approval["approvers"]) == {"alice", "bruno"}


def test_a_client_without_a_holdpoint_token_is_refused_and_nothing_starts(
    downstream, gateway, viewer, files: Path
) -> None:
    gw = gateway(downstream())
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Token x"}):
        response = httpx.post(
            gw.url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Accept": "application/json, text/event-stream", **headers},
            timeout=30,
        )
        assert response.status_code == 401, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "not_authenticated"
    # A person Holdpoint knows but who may not start runs (a viewer): told, nothing runs.
    viewer_token = Token.objects.create(user=viewer).key
    refused = call(gw, "files__write_file", {"path": "v", "text": "v"}, "s-v", token=viewer_token)
    assert refused.is_error and status_of(refused) == "refused", refused
    assert not Run.objects.filter(agent=AGENT).exists()
    assert writes(files) == []


def test_one_persons_session_name_is_not_anothers(downstream, gateway, approver) -> None:
    """Two people whose clients name the same session get two runs, each started as its
    person (so the approval policy knows who asked)."""
    from tests.conftest import _user

    gw = gateway(downstream())
    other = _user("otto", "operator")
    other_token = Token.objects.create(user=other).key
    planned = {"path": "same.txt", "text": "x"}
    assert status_of(call(gw, "files__write_file", planned, "shared")) == "pending"
    assert status_of(call(gw, "files__write_file", planned, "shared", token=other_token)) == (
        "pending"
    )
    runs = list(Run.objects.filter(agent=AGENT).order_by("created_at"))
    assert len(runs) == 2
    assert {run.created_by.username for run in runs} == {"olivia", "otto"}


def test_a_persons_calls_are_throttled(downstream, launch: Launcher, files: Path) -> None:
    gw = launch.gateway(launch.downstream(), extra=("calls_per_minute = 2",))
    answers = [call(gw, "files__read_file", {"path": "none"}, "s-throttle") for _ in range(3)]
    assert status_of(answers[-1]) == "throttled", answers[-1]
    assert [status_of(a) for a in answers[:2]] != ["throttled", "throttled"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("files__nope", {}),
        ("nope", {}),
        ("__write_file", {}),
        ("files__write_file\u202e", {"path": "a", "text": "b"}),
        ("files__write_file", {"path": "x" * 70_000, "text": ""}),
        ("files__write_file", {"path": ["not", "a", "string"], "text": {"deep": [1, 2]}}),
    ],
)
def test_bad_calls_are_refused_in_the_result_and_make_nothing(
    downstream, gateway, tool: str, arguments: dict[str, Any], files: Path
) -> None:
    gw = gateway(downstream())
    answer_ = call(gw, tool, arguments, "s-fuzz")
    assert answer_.is_error, answer_
    assert writes(files) == []
    assert not SideEffect.objects.exists()


def test_the_rules_people_confirm_decide_each_call(downstream, gateway, files: Path) -> None:
    """The gateway reports the downstream tools (annotations suggest; nothing is in force
    unconfirmed); a person confirms the suggestions (read_file: pass), then sets
    write_file to record with a pattern that asks for paths under secrets/. A pass call is
    made at once and is not in the ledger; a record call is in the ledger and asks nobody;
    a call the pattern matches waits for an approval."""
    from ledger.models import ToolRule
    from ledger.services.tool_rules import tool_rule_confirm, tool_rules_confirm_suggested
    from tests.conftest import _user

    admin_user = _user("ada", "admin")

    (files / "readme.txt").write_text("hello")
    gw = gateway(downstream())
    reported = {rule.tool: rule for rule in ToolRule.objects.filter(agent=AGENT)}
    assert reported["read_file"].suggested == "pass"
    assert reported["write_file"].suggested == "approve"
    assert all(rule.rule is None for rule in reported.values())  # none in force yet
    assert status_of(call(gw, "files__read_file", {"path": "readme.txt"}, "s-r0")) == "pending"

    tool_rules_confirm_suggested(agent=AGENT, user=admin_user)
    tool_rule_confirm(
        agent=AGENT,
        server="files",
        tool="write_file",
        rule="record",
        patterns=[{"argument": "path", "matches": "secrets/*", "rule": "approve"}],
        user=admin_user,
    )

    # The gateway asks for the rules again after 5 s: the read passes from then on.
    # (Probed in sessions of their own: a probe that still asked holds its session's
    # later ledger calls behind its approval, as a run's steps go one at a time.)
    probes = iter(range(100))

    def passes() -> Any:
        read = call(gw, "files__read_file", {"path": "readme.txt"}, f"s-probe-{next(probes)}")
        return read if not read.is_error else None

    assert wait_for(passes, 30, "the read to pass").content[0].text == "hello"
    read = call(gw, "files__read_file", {"path": "readme.txt"}, "s-rules")
    assert not read.is_error, read
    recorded = call(gw, "files__write_file", {"path": "log.txt", "text": "r"}, "s-rules")
    assert not recorded.is_error, recorded
    run = run_of("s-rules")
    [effect] = SideEffect.objects.filter(run_id=run.id)  # the read is not in the ledger
    assert effect.tool == "files__write_file" and effect.status == "confirmed"
    assert effect.approval is None
    guarded = call(gw, "files__write_file", {"path": "secrets/k", "text": "s"}, "s-rules")
    assert status_of(guarded) == "pending", guarded
    assert [w["path"] for w in writes(files)] == ["log.txt"]
