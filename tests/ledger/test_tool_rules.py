"""The MCP gateway's tool rules (ledger.services.tool_rules): annotations only suggest,
an unconfirmed tool asks for approval, a report never changes a person's rule, a changed
tool says so, every person's change is in the audit trail, and bad input changes nothing."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import close_old_connections, connection

from ledger.models import ToolRule
from ledger.services import tool_rules as rules
from runs import services
from runs.audit import DASHBOARD, TOOL_RULE_CONFIRMED
from runs.audit_log import AuditFilter, audit_page
from runs.errors import HoldpointError
from runs.models import AgentEvent
from runs.tokens import Serving, serving_for, worker_token_create
from tests.conftest import _user

pytestmark = pytest.mark.django_db

AGENT = "gw-agent"


def tool(name: str, **annotations: Any) -> dict[str, Any]:
    return {
        "server": "files",
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "annotations": annotations,
    }


def gateway(token: str = "gateway", agent: str = AGENT) -> Serving:
    """A worker token that declared ``agent`` (its owner), as the gateway is."""
    made, _secret = worker_token_create(name=token)
    serving = serving_for(made)
    services.agent_declare(name=agent, actor=f"worker:{token}", serving=serving)
    return serving_for(made)


def admin(name: str = "ada") -> User:
    # A transactional test may follow another's flush, which took the groups too.
    return _user(name, "admin")


def state() -> list[tuple[Any, ...]]:
    """Everything a refused call must leave as it was."""
    return [
        *ToolRule.objects.order_by("id").values_list(
            "server", "tool", "rule", "patterns", "suggested", "reported_hash", "offered"
        ),
        *AgentEvent.objects.order_by("id").values_list("type", "payload"),
    ]


def test_it_suggests_from_the_annotations_and_asks_until_confirmed() -> None:
    serving = gateway()
    rows = rules.tool_rules_report(
        agent=AGENT,
        tools=[
            tool("read_file", readOnlyHint=True),
            tool("append_log", destructiveHint=False),
            tool("delete_file", destructiveHint=True),
            tool("mystery"),
            # Read-only wins over "not destructive"; an idempotent write still asks.
            tool("list", readOnlyHint=True, destructiveHint=False),
            tool("put", idempotentHint=True),
        ],
        serving=serving,
    )
    by_name = {row.tool: row for row in rows}
    assert {name: row.suggested for name, row in by_name.items()} == {
        "read_file": "pass",
        "append_log": "record",
        "delete_file": "approve",
        "mystery": "approve",
        "list": "pass",
        "put": "approve",
    }
    # Annotations are hints from the downstream server: nothing is in force before a person.
    assert {row.in_force for row in rows} == {"approve"}
    assert not any(row.confirmed for row in rows)
    assert AgentEvent.objects.count() == 0


def test_unknown_annotation_keys_are_dropped_and_wrong_types_refused() -> None:
    serving = gateway()
    (row,) = rules.tool_rules_report(
        agent=AGENT,
        tools=[tool("read_file", readOnlyHint=True, evil="x", title="Read")],
        serving=serving,
    )
    assert row.annotations == {"readOnlyHint": True, "title": "Read"}
    before = state()
    with pytest.raises(HoldpointError) as refused:
        rules.tool_rules_report(
            agent=AGENT, tools=[tool("read_file", readOnlyHint="yes")], serving=serving
        )
    assert refused.value.extra["errors"][0]["pointer"] == "/tools/0/annotations/readOnlyHint"
    assert state() == before


def test_a_report_keeps_a_persons_rule_and_marks_a_change() -> None:
    serving = gateway()
    ada = admin()
    rules.tool_rules_report(
        agent=AGENT, tools=[tool("write_file", destructiveHint=True)], serving=serving
    )
    pattern = {"argument": "path", "matches": "/tmp/*", "rule": "record"}
    confirmed = rules.tool_rule_confirm(
        agent=AGENT,
        server="files",
        tool="write_file",
        rule="approve",
        patterns=[pattern],
        user=ada,
        via=DASHBOARD,
        identity="session:password",
    )
    assert (confirmed.rule, confirmed.confirmed_by, confirmed.confirmed_actor) == (
        "approve",
        ada,
        "user:ada",
    )
    assert confirmed.confirmed_at is not None
    assert not confirmed.changed_since_confirmed

    # The same tool again: nothing changed.
    (same,) = rules.tool_rules_report(
        agent=AGENT, tools=[tool("write_file", destructiveHint=True)], serving=serving
    )
    assert not same.changed_since_confirmed

    # The downstream server now calls it harmless and changes its schema: the person's
    # rule and pattern stay, and the row says it changed since it was confirmed.
    changed = tool("write_file", destructiveHint=False)
    changed["input_schema"]["properties"]["mode"] = {"type": "string"}
    (row,) = rules.tool_rules_report(agent=AGENT, tools=[changed], serving=serving)
    assert (row.rule, row.patterns, row.in_force) == ("approve", [pattern], "approve")
    assert row.suggested == "record"
    assert row.changed_since_confirmed
    assert "mode" in row.input_schema["properties"]

    # Confirming again clears the mark.
    again = rules.tool_rule_confirm(
        agent=AGENT, server="files", tool="write_file", rule="approve", user=ada
    )
    assert not again.changed_since_confirmed
    assert again.patterns == []


def test_a_tool_left_out_is_kept_not_offered_and_offered_again_later() -> None:
    serving = gateway()
    ada = admin()
    rules.tool_rules_report(
        agent=AGENT, tools=[tool("a", readOnlyHint=True), tool("b")], serving=serving
    )
    rules.tool_rule_confirm(agent=AGENT, server="files", tool="b", rule="record", user=ada)
    rows = {
        r.tool: r for r in rules.tool_rules_report(agent=AGENT, tools=[tool("a")], serving=serving)
    }
    assert (rows["a"].offered, rows["b"].offered, rows["b"].rule) == (True, False, "record")
    rows = {
        r.tool: r for r in rules.tool_rules_report(agent=AGENT, tools=[tool("b")], serving=serving)
    }
    assert (rows["a"].offered, rows["b"].offered, rows["b"].rule) == (False, True, "record")


def test_confirm_suggested_confirms_only_the_unconfirmed() -> None:
    serving = gateway()
    ada = admin()
    rules.tool_rules_report(
        agent=AGENT,
        tools=[tool("read", readOnlyHint=True), tool("log", destructiveHint=False), tool("rm")],
        serving=serving,
    )
    rules.tool_rule_confirm(agent=AGENT, server="files", tool="read", rule="approve", user=ada)
    done = rules.tool_rules_confirm_suggested(agent=AGENT, user=ada)
    assert sorted(row.tool for row in done) == ["log", "rm"]
    in_force = {row.tool: row.in_force for row in rules.tool_rules_for(AGENT)}
    # A person's choice is never replaced by the suggestion.
    assert in_force == {"read": "approve", "log": "record", "rm": "approve"}
    assert rules.tool_rules_confirm_suggested(agent=AGENT, user=ada) == []
    assert AgentEvent.objects.filter(type=TOOL_RULE_CONFIRMED).count() == 3


def test_every_change_is_in_the_audit_trail_with_who_and_how() -> None:
    serving = gateway()
    ada = admin()
    rules.tool_rules_report(agent=AGENT, tools=[tool("rm")], serving=serving)
    rules.tool_rule_confirm(
        agent=AGENT,
        server="files",
        tool="rm",
        rule="record",
        patterns=[{"argument": "path", "matches": "/etc/*", "rule": "approve"}],
        user=ada,
        via=DASHBOARD,
        identity="session:password",
    )
    rows, _next = audit_page(AuditFilter(), before=None, limit=10)
    assert [row["type"] for row in rows] == [TOOL_RULE_CONFIRMED]
    row = rows[0]
    assert (row["agent"], row["actor"], row["via"], row["identity"], row["run_id"]) == (
        AGENT,
        "user:ada",
        "dashboard",
        "session:password",
        None,
    )
    assert row["summary"] == "rule of files/rm: record, 1 pattern (was not confirmed)"


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        ({"rule": "allow"}, "/rule"),
        ({"rule": None}, "/rule"),
        ({"patterns": "x"}, "/patterns"),
        (
            {"patterns": [{"argument": "path", "matches": "x" * 201, "rule": "pass"}]},
            "/patterns/0/matches",
        ),
        (
            {"patterns": [{"argument": "path", "matches": "", "rule": "pass"}]},
            "/patterns/0/matches",
        ),
        ({"patterns": [{"argument": "path", "matches": "*", "rule": "deny"}]}, "/patterns/0/rule"),
        ({"patterns": [{"argument": "", "matches": "*", "rule": "pass"}]}, "/patterns/0/argument"),
        ({"patterns": [{"argument": "p", "matches": "*", "rule": "pass", "x": 1}]}, "/patterns/0"),
        ({"patterns": [{"argument": "p", "matches": "*", "rule": "pass"}] * 21}, "/patterns"),
    ],
)
def test_a_bad_rule_or_pattern_changes_nothing(change: dict[str, Any], pointer: str) -> None:
    serving = gateway()
    ada = admin()
    rules.tool_rules_report(agent=AGENT, tools=[tool("rm")], serving=serving)
    before = state()
    args: dict[str, Any] = {"rule": "record", "patterns": [], **change}
    with pytest.raises(HoldpointError) as refused:
        rules.tool_rule_confirm(agent=AGENT, server="files", tool="rm", user=ada, **args)
    assert refused.value.code == "invalid_input"
    assert refused.value.extra["errors"][0]["pointer"] == pointer
    assert state() == before


def test_twenty_patterns_are_allowed() -> None:
    serving = gateway()
    rules.tool_rules_report(agent=AGENT, tools=[tool("rm")], serving=serving)
    patterns = [{"argument": "p", "matches": f"/{n}/*", "rule": "pass"} for n in range(20)]
    row = rules.tool_rule_confirm(
        agent=AGENT, server="files", tool="rm", rule="approve", patterns=patterns, user=admin()
    )
    assert row.patterns == patterns


def test_a_page_that_saw_another_version_of_the_tool_changes_nothing() -> None:
    serving = gateway()
    (row,) = rules.tool_rules_report(agent=AGENT, tools=[tool("rm")], serving=serving)
    seen = row.reported_hash
    rules.tool_rules_report(agent=AGENT, tools=[tool("rm", destructiveHint=False)], serving=serving)
    before = state()
    with pytest.raises(HoldpointError) as refused:
        rules.tool_rule_confirm(
            agent=AGENT, server="files", tool="rm", rule="pass", seen_hash=seen, user=admin()
        )
    assert refused.value.code == "invalid_state"
    assert state() == before


@pytest.mark.parametrize(
    ("tools", "pointer"),
    [
        ("nope", "/tools"),
        ([tool("t")] * 2, "/tools/1"),
        ([{**tool("t"), "server": "Files"}], "/tools/0/server"),
        ([{**tool("t"), "server": "-files"}], "/tools/0/server"),
        ([{**tool("t"), "server": "f" * 65}], "/tools/0/server"),
        ([{**tool("t"), "name": "has space"}], "/tools/0/name"),
        ([{**tool("t"), "name": ""}], "/tools/0/name"),
        ([{**tool("t"), "name": "x" * 129}], "/tools/0/name"),
        ([{**tool("t"), "description": "d" * 2001}], "/tools/0/description"),
        ([{**tool("t"), "input_schema": []}], "/tools/0/input_schema"),
        (
            [{**tool("t"), "input_schema": {"description": "x" * (32 * 1024)}}],
            "/tools/0/input_schema",
        ),
        ([{**tool("t"), "annotations": []}], "/tools/0/annotations"),
        ([tool(f"t{n}") for n in range(501)], "/tools"),
    ],
)
def test_a_bad_report_changes_nothing(tools: Any, pointer: str) -> None:
    serving = gateway()
    rules.tool_rules_report(agent=AGENT, tools=[tool("keep")], serving=serving)
    before = state()
    with pytest.raises(HoldpointError) as refused:
        rules.tool_rules_report(agent=AGENT, tools=tools, serving=serving)
    assert refused.value.code == "invalid_input"
    assert refused.value.extra["errors"][0]["pointer"] == pointer
    assert state() == before


def test_five_hundred_tools_are_allowed() -> None:
    serving = gateway()
    rows = rules.tool_rules_report(
        agent=AGENT, tools=[tool(f"t{n}") for n in range(500)], serving=serving
    )
    assert len(rows) == 500


def test_only_the_agents_own_gateway_reports_or_reads() -> None:
    serving = gateway()
    rules.tool_rules_report(agent=AGENT, tools=[tool("keep")], serving=serving)
    before = state()
    other = gateway(token="other", agent="other-agent")
    with pytest.raises(HoldpointError) as refused:
        rules.tool_rules_report(agent=AGENT, tools=[tool("evil")], serving=other)
    assert refused.value.code == "agent_not_yours"
    with pytest.raises(HoldpointError) as read:
        rules.tool_rules_read(agent=AGENT, serving=other)
    assert read.value.code == "agent_not_yours"
    with pytest.raises(HoldpointError) as unknown:
        rules.tool_rules_report(agent="nobody", tools=[tool("evil")], serving=serving)
    assert unknown.value.code == "not_found"
    # A token scoped to other agents may not, even for an agent nobody owns yet.
    scoped, _ = worker_token_create(name="scoped", agents=["something-else"])
    services.agent_declare(name="free", actor="cli", owners=["scoped"])
    with pytest.raises(HoldpointError) as scope:
        rules.tool_rules_report(agent="free", tools=[tool("x")], serving=serving_for(scoped))
    assert scope.value.code == "agent_not_yours"
    assert state() == before


def test_an_unknown_tool_is_not_found() -> None:
    gateway()
    with pytest.raises(HoldpointError) as refused:
        rules.tool_rule_confirm(agent=AGENT, server="files", tool="nope", rule="pass", user=admin())
    assert refused.value.code == "not_found"
    assert AgentEvent.objects.count() == 0


# --- PostgreSQL: two people at once ---------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_confirmation_racing_confirm_suggested_is_never_overwritten() -> None:
    """Confirm-suggested locks the unconfirmed rows with its condition: a row a person
    confirmed while it waited is read again and left alone, whichever commits first."""
    serving = gateway()
    ada, bob = admin("ada"), admin("bob")
    for round_ in range(6):
        name = f"rm{round_}"
        rules.tool_rules_report(agent=AGENT, tools=[tool(name)], serving=serving)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def choose(name: str = name) -> None:
            try:
                barrier.wait()
                rules.tool_rule_confirm(
                    agent=AGENT, server="files", tool=name, rule="pass", user=ada
                )
            except BaseException as exc:
                errors.append(exc)
            finally:
                close_old_connections()

        def accept_all() -> None:
            try:
                barrier.wait()
                rules.tool_rules_confirm_suggested(agent=AGENT, user=bob)
            except BaseException as exc:
                errors.append(exc)
            finally:
                close_old_connections()

        threads = [threading.Thread(target=choose), threading.Thread(target=accept_all)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        row = ToolRule.objects.get(agent=AGENT, tool=name)
        # Whatever the order, the person's explicit choice is the rule in force.
        assert (row.rule, row.confirmed_actor) == ("pass", "user:ada")
        events = list(
            AgentEvent.objects.filter(payload__tool=name)
            .order_by("id")
            .values_list("actor", flat=True)
        )
        assert events[-1] == "user:ada"
        assert len(events) in (1, 2)
    assert connection.vendor == "postgresql"


def test_the_admin_group_holds_the_permission_and_no_other_does() -> None:
    holders = set(
        Group.objects.filter(
            permissions__content_type__app_label="ledger",
            permissions__codename="change_toolrule",
        ).values_list("name", flat=True)
    )
    assert holders == {"admin"}


def test_the_same_report_again_writes_nothing() -> None:
    serving = gateway()
    tools = [tool(f"t{n}", readOnlyHint=n % 2 == 0) for n in range(5)]
    first = {
        row.tool: row.updated_at
        for row in rules.tool_rules_report(agent=AGENT, tools=tools, serving=serving)
    }
    again = {
        row.tool: row.updated_at
        for row in rules.tool_rules_report(agent=AGENT, tools=tools, serving=serving)
    }
    assert again == first
    tools[2]["description"] = "Now it does more."
    third = {
        row.tool: row.updated_at
        for row in rules.tool_rules_report(agent=AGENT, tools=tools, serving=serving)
    }
    assert [name for name in third if third[name] != first[name]] == ["t2"]
