"""The agent page (``/agents/<name>/``): the tools of its MCP gateway, each with its hints
in words, its suggestion, the rule in force and who confirmed it; a form per tool (rule and
argument patterns, rows added and removed without JavaScript) and "Confirm all
suggestions" for admins; read-only for everyone else; downstream text escaped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import translation

from ledger.models import ToolRule
from ledger.services import tool_rules as rules
from runs import services
from runs.models import AgentEvent
from runs.tokens import serving_for, worker_token_create
from tests.dashboard.support import HTMX, hidden, text

pytestmark = pytest.mark.django_db

AGENT = "gw-agent"
PAGE = f"/agents/{AGENT}/"
EVIL = "<script>alert(1)</script>\u202egnp.exe"


def tool(name: str, **annotations: Any) -> dict[str, Any]:
    return {
        "server": "files",
        "name": name,
        "description": f"The {name} tool. {EVIL}",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "annotations": annotations,
    }


@pytest.fixture
def gateway(db: None) -> Any:
    made, _secret = worker_token_create(name="gateway")
    services.agent_declare(name=AGENT, actor="worker:gateway", serving=serving_for(made))
    serving = serving_for(made)
    rules.tool_rules_report(
        agent=AGENT,
        tools=[
            tool("read_file", readOnlyHint=True, title=EVIL),
            tool("append_log", destructiveHint=False, idempotentHint=False),
            tool("delete_file", destructiveHint=True, openWorldHint=False),
        ],
        serving=serving,
    )
    return serving


@pytest.fixture
def admin(db: None) -> User:
    user = User.objects.create_user(username="ada", password="pw")
    user.groups.add(Group.objects.get(name="admin"))
    return user


def row(name: str) -> ToolRule:
    return ToolRule.objects.get(agent=AGENT, tool=name)


def card(page: str, name: str) -> str:
    start = page.index(f'id="tool-{row(name).pk}"')
    return page[start : page.index("</article>", start)]


def state() -> list[Any]:
    return [
        *ToolRule.objects.order_by("id").values_list("tool", "rule", "patterns"),
        *AgentEvent.objects.order_by("id").values_list("payload"),
    ]


def form_data(page: str, name: str, **values: Any) -> dict[str, Any]:
    html = card(page, name)
    data = {
        "idempotency_key": hidden(html, "idempotency_key"),
        "tool_rule": hidden(html, "tool_rule"),
        "schema_hash": hidden(html, "schema_hash"),
        "pattern_rows": hidden(html, "pattern_rows"),
        "rule": "approve",
        "action": "save",
    }
    data.update(values)
    return data


def test_the_agents_list_links_to_the_agent_page(client: Client, admin: User, gateway: Any) -> None:
    client.force_login(admin)
    assert f'href="{PAGE}"' in client.get("/agents/").content.decode()


def test_it_shows_each_tool_in_words_and_unconfirmed_asks(
    client: Client, admin: User, gateway: Any
) -> None:
    client.force_login(admin)
    response = client.get(PAGE)
    assert response.status_code == 200
    page = text(response)
    assert "Tools through the MCP gateway" in page
    read = card(page, "read_file")
    assert "Says it only reads" in read
    assert "Pass (a read, not recorded)" in read  # the suggestion
    assert 'data-in-force="approve"' in read
    assert "Not confirmed: asks for approval until someone confirms" in read
    assert "Says it only adds, never deletes or overwrites" in card(page, "append_log")
    assert "Says repeating a call does it again" in card(page, "append_log")
    assert "Says it may delete or overwrite" in card(page, "delete_file")
    assert "Says it stays within its server" in card(page, "delete_file")
    assert "Confirm all suggestions (3 tools)" in page


def test_downstream_text_is_escaped_and_isolated(client: Client, admin: User, gateway: Any) -> None:
    client.force_login(admin)
    raw = client.get(PAGE).content.decode()
    assert "<script>alert(1)" not in raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw
    # Every copy of the untrusted text sits in its own <bdi>, so its RTL override stays inside.
    assert raw.count("\u202e") == raw.count("<bdi>&lt;script&gt;") + raw.count(
        'class="untrusted">The'
    )


def test_an_admin_confirms_a_rule_with_a_pattern(client: Client, admin: User, gateway: Any) -> None:
    client.force_login(admin)
    page = text(client.get(PAGE))
    data = form_data(
        page,
        "delete_file",
        rule="record",
        **{
            "pattern-0-argument": "path",
            "pattern-0-matches": "/etc/*",
            "pattern-0-rule": "approve",
        },
    )
    response = client.post(f"/agents/{AGENT}/tool-rules/{row('delete_file').pk}", data)
    assert response.status_code == 303
    assert response["Location"].startswith(PAGE)
    saved = row("delete_file")
    assert (saved.rule, saved.patterns, saved.confirmed_by) == (
        "record",
        [{"argument": "path", "matches": "/etc/*", "rule": "approve"}],
        admin,
    )
    event = AgentEvent.objects.get()
    assert (event.payload["via"], event.payload["identity"]) == ("dashboard", "session:password")
    # The same form again (a double click) changes nothing more.
    again = client.post(f"/agents/{AGENT}/tool-rules/{row('delete_file').pk}", data)
    assert again.status_code == 303
    assert AgentEvent.objects.count() == 1
    after = text(client.get(PAGE))
    shown = card(after, "delete_file")
    assert "by ada" in shown
    assert "with 1 argument pattern" in shown
    assert 'value="/etc/*"' in shown


def test_add_a_row_and_remove_one_without_javascript(
    client: Client, admin: User, gateway: Any
) -> None:
    client.force_login(admin)
    rules.tool_rule_confirm(
        agent=AGENT,
        server="files",
        tool="delete_file",
        rule="approve",
        patterns=[
            {"argument": "path", "matches": "/tmp/*", "rule": "pass"},
            {"argument": "path", "matches": "/var/*", "rule": "record"},
        ],
        user=admin,
    )
    before = state()
    page = text(client.get(PAGE))
    # Two patterns and one blank row; "Add a pattern row" brings a second blank row, unsaved.
    assert hidden(card(page, "delete_file"), "pattern_rows") == "3"
    data = form_data(
        page,
        "delete_file",
        action="add_row",
        **{
            "pattern-0-argument": "path",
            "pattern-0-matches": "/tmp/*",
            "pattern-0-rule": "pass",
            "pattern-1-argument": "path",
            "pattern-1-matches": "/var/*",
            "pattern-1-rule": "record",
        },
    )
    added = text(client.post(f"/agents/{AGENT}/tool-rules/{row('delete_file').pk}", data))
    assert hidden(card(added, "delete_file"), "pattern_rows") == "4"
    assert state() == before
    # Remove the first, keep the second, add one in the new row.
    data = form_data(
        added,
        "delete_file",
        **{
            "pattern-0-argument": "path",
            "pattern-0-matches": "/tmp/*",
            "pattern-0-rule": "pass",
            "pattern-0-remove": "1",
            "pattern-1-argument": "path",
            "pattern-1-matches": "/var/*",
            "pattern-1-rule": "record",
            "pattern-3-argument": "url",
            "pattern-3-matches": "https://*",
            "pattern-3-rule": "pass",
        },
    )
    response = client.post(f"/agents/{AGENT}/tool-rules/{row('delete_file').pk}", data)
    assert response.status_code == 303
    assert row("delete_file").patterns == [
        {"argument": "path", "matches": "/var/*", "rule": "record"},
        {"argument": "url", "matches": "https://*", "rule": "pass"},
    ]


def test_an_htmx_post_gets_the_card_back(client: Client, admin: User, gateway: Any) -> None:
    client.force_login(admin)
    page = text(client.get(PAGE))
    data = form_data(page, "read_file", rule="pass")
    response = client.post(f"/agents/{AGENT}/tool-rules/{row('read_file').pk}", data, **HTMX)
    assert response.status_code == 200
    body = text(response)
    assert body.lstrip().startswith(f'<article id="tool-{row("read_file").pk}"')
    assert "Rule confirmed: Pass (a read, not recorded)." in body
    assert 'data-in-force="pass"' in body


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ({"rule": "allow"}, "A rule is one of"),
        (
            {
                "pattern-0-argument": "path",
                "pattern-0-matches": "x" * 201,
                "pattern-0-rule": "pass",
            },
            "A glob is 1 to 200 characters",
        ),
        ({"pattern-0-argument": "path", "pattern-0-rule": "pass"}, "A glob is 1 to 200"),
        (
            {"pattern-0-argument": "path", "pattern-0-matches": "*", "pattern-0-rule": "nope"},
            "A rule is one of",
        ),
    ],
)
def test_bad_input_keeps_what_was_typed_and_saves_nothing(
    client: Client, admin: User, gateway: Any, values: dict[str, str], shown: str
) -> None:
    client.force_login(admin)
    before = state()
    page = text(client.get(PAGE))
    data = form_data(page, "delete_file", **values)
    response = client.post(f"/agents/{AGENT}/tool-rules/{row('delete_file').pk}", data)
    assert response.status_code == 422
    body = text(response)
    assert shown in body
    assert "Nothing was saved." in body
    if "pattern-0-argument" in values:
        assert 'value="path"' in card(body, "delete_file")
    assert state() == before


def test_a_tool_that_changed_since_the_page_is_not_confirmed(
    client: Client, admin: User, gateway: Any
) -> None:
    client.force_login(admin)
    page = text(client.get(PAGE))
    rules.tool_rules_report(
        agent=AGENT, tools=[tool("delete_file", destructiveHint=False)], serving=gateway
    )
    before = state()
    data = form_data(page, "delete_file", rule="pass")
    response = client.post(f"/agents/{AGENT}/tool-rules/{row('delete_file').pk}", data, **HTMX)
    assert response.status_code == 409
    assert "The tool changed since this page was shown" in text(response)
    assert state() == before


def test_changed_since_confirmed_is_shown(client: Client, admin: User, gateway: Any) -> None:
    client.force_login(admin)
    rules.tool_rule_confirm(
        agent=AGENT, server="files", tool="delete_file", rule="approve", user=admin
    )
    assert "data-changed" not in card(text(client.get(PAGE)), "delete_file")
    rules.tool_rules_report(
        agent=AGENT, tools=[tool("delete_file", destructiveHint=False)], serving=gateway
    )
    page = text(client.get(PAGE))
    shown = card(page, "delete_file")
    assert "Changed since confirmed" in shown
    assert 'data-in-force="approve"' in shown
    assert "Not offered by the gateway now" in card(page, "read_file")


def test_confirm_all_suggestions(client: Client, admin: User, gateway: Any) -> None:
    client.force_login(admin)
    rules.tool_rule_confirm(
        agent=AGENT, server="files", tool="read_file", rule="approve", user=admin
    )
    page = text(client.get(PAGE))
    form = page.split(f'action="/agents/{AGENT}/tool-rules/confirm-suggested"')[1]
    key = hidden(form, "idempotency_key")
    url = f"/agents/{AGENT}/tool-rules/confirm-suggested"
    response = client.post(url, {"idempotency_key": key, "agent": AGENT})
    assert response.status_code == 303
    assert {r.tool: r.in_force for r in ToolRule.objects.all()} == {
        "read_file": "approve",
        "append_log": "record",
        "delete_file": "approve",
    }
    assert "Confirmed the suggestion of 2 tools." in text(client.get(PAGE))
    assert "Confirm all suggestions" not in text(client.get(PAGE))
    # A form for another agent is out of date: nothing happens.
    count = AgentEvent.objects.count()
    assert client.post(url, {"idempotency_key": "other", "agent": "x"}).status_code == 303
    assert AgentEvent.objects.count() == count


def test_people_without_the_permission_see_it_read_only(
    client: Client, operator: User, viewer: User, outsider: User, gateway: Any
) -> None:
    pk = row("delete_file").pk
    before = state()
    for person in (operator, viewer):
        client.force_login(person)
        page = text(client.get(PAGE))
        assert "Tools through the MCP gateway" in page
        assert "Only admins can confirm the rules of an agent's tools." in page
        assert "tool-rule-form" not in page
        assert "Confirm all suggestions" not in page
        data = {"idempotency_key": "k", "tool_rule": str(pk), "rule": "pass", "action": "save"}
        assert client.post(f"/agents/{AGENT}/tool-rules/{pk}", data).status_code == 403
        url = f"/agents/{AGENT}/tool-rules/confirm-suggested"
        assert client.post(url, {"idempotency_key": "k", "agent": AGENT}).status_code == 403
    client.force_login(outsider)
    assert client.get(PAGE).status_code == 403
    client.logout()
    assert client.get(PAGE).status_code == 302
    assert state() == before


def test_404_and_405(client: Client, admin: User, gateway: Any) -> None:
    client.force_login(admin)
    assert client.get("/agents/nobody/").status_code == 404
    data = {"idempotency_key": "k", "tool_rule": "999999", "rule": "pass", "action": "save"}
    assert client.post(f"/agents/{AGENT}/tool-rules/999999", data).status_code == 404
    assert client.post("/agents/nobody/tool-rules/confirm-suggested", {}).status_code == 404
    assert client.post(PAGE).status_code == 405
    assert client.get(f"/agents/{AGENT}/tool-rules/{row('read_file').pk}").status_code == 405
    # An agent with no gateway says so.
    assert "No MCP gateway has reported tools" in text(client.get("/agents/test-agent/"))


@pytest.fixture
def back_to_english() -> Iterator[None]:
    """A request in Chinese leaves Chinese active in this thread (LocaleMiddleware does not
    undo it): put the default back, so later tests that render outside a request do not
    speak Chinese."""
    yield
    translation.deactivate()


def test_it_speaks_chinese(
    client: Client, admin: User, gateway: Any, back_to_english: None
) -> None:
    # Chinese text uses full-width punctuation on purpose.
    client.force_login(admin)
    page = text(client.get(PAGE, HTTP_ACCEPT_LANGUAGE="zh-Hans"))
    for words in (
        "经由 MCP 网关的工具",
        "未确认：在有人确认之前，每次调用都需要审批",  # noqa: RUF001
        "自称只读",
        "放行（只读，不记录）",  # noqa: RUF001
        "全部按建议确认（3 个工具）",  # noqa: RUF001
        "添加一行模式",
    ):
        assert words in page, words
