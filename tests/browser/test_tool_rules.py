"""The agent page in Chromium: an admin opens it from the Agents list, edits a tool's rule
with an argument pattern (adding a pattern row with the button, htmx swapping the card),
confirms every other suggestion; a viewer sees it read-only; a phone never scrolls
sideways; without JavaScript the same form works."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import Group, User
from playwright.sync_api import expect

from ledger.models import ToolRule
from ledger.services import tool_rules as rules
from runs import services
from runs.models import AgentEvent
from runs.tokens import serving_for, worker_token_create
from tests.browser.conftest import login, shot

AGENT = "gw-agent"


def gateway() -> None:
    made, _secret = worker_token_create(name="gateway")
    services.agent_declare(
        name=AGENT, actor="worker:gateway", serving=serving_for(made), description="Files."
    )
    rules.tool_rules_report(
        agent=AGENT,
        tools=[
            {
                "server": "files",
                "name": "read_file",
                "description": "Read a file.",
                "input_schema": {"type": "object"},
                "annotations": {"readOnlyHint": True},
            },
            {
                "server": "files",
                "name": "append_log",
                "description": "Append a line.",
                "input_schema": {"type": "object"},
                "annotations": {"destructiveHint": False},
            },
            {
                "server": "files",
                "name": "write_file_with_a_rather_long_name_that_must_wrap_on_phones",
                "description": "Write a file. " + "x" * 300,
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                "annotations": {"destructiveHint": True},
            },
        ],
        serving=serving_for(made),
    )


def admin() -> User:
    user = User.objects.create_user(username="ada", password="pw-ada")
    user.groups.add(Group.objects.get(name="admin"))
    return user


def card_of(page: Any, tool: str) -> Any:
    return page.locator(f'article[data-tool="files/{tool}"]')


def test_an_admin_edits_a_rule_with_a_pattern_and_confirms_the_suggestions(page: Any) -> None:
    gateway()
    admin()
    write = "write_file_with_a_rather_long_name_that_must_wrap_on_phones"
    login(page, "ada")
    page.goto("/agents/")
    page.get_by_role("link", name=AGENT, exact=True).click()
    page.wait_for_url(re.compile(rf".*/agents/{AGENT}/$"))
    expect(page.get_by_role("heading", name="Tools through the MCP gateway")).to_be_visible()
    card = card_of(page, write)
    expect(card).to_contain_text("Not confirmed: asks for approval until someone confirms")
    expect(card).to_contain_text("Says it may delete or overwrite")

    card.get_by_label("Rule", exact=True).select_option("record")
    card.locator('input[name="pattern-0-argument"]').fill("path")
    card.locator('input[name="pattern-0-matches"]').fill("/etc/*")
    card.locator('select[name="pattern-0-rule"]').select_option("approve")
    # Another row: the card comes back with what was typed and one more row, nothing saved.
    card.get_by_role("button", name="Add a pattern row").click()
    expect(card.locator('input[name="pattern-1-argument"]')).to_be_visible()
    expect(card.locator('input[name="pattern-0-matches"]')).to_have_value("/etc/*")
    assert AgentEvent.objects.count() == 0
    card.locator('input[name="pattern-1-argument"]').fill("path")
    card.locator('input[name="pattern-1-matches"]').fill("/tmp/*")
    card.locator('select[name="pattern-1-rule"]').select_option("pass")
    shot(page, "tool-rule-edit")
    card.get_by_role("button", name=re.compile("Confirm rule of")).click()
    expect(card).to_contain_text("Rule confirmed: Record in the ledger, no approval.")
    expect(card).to_contain_text("by ada")
    expect(card).to_contain_text("with 2 argument patterns")
    row = ToolRule.objects.get(agent=AGENT, tool=write)
    assert (row.rule, row.patterns) == (
        "record",
        [
            {"argument": "path", "matches": "/etc/*", "rule": "approve"},
            {"argument": "path", "matches": "/tmp/*", "rule": "pass"},
        ],
    )

    page.get_by_role("button", name=re.compile("Confirm all suggestions")).click()
    expect(page.locator(".flash-success")).to_contain_text("Confirmed the suggestion of 2 tools.")
    expect(card_of(page, "read_file")).to_have_attribute("data-rule", "pass")
    expect(card_of(page, "append_log")).to_have_attribute("data-rule", "record")
    expect(card_of(page, write)).to_have_attribute("data-rule", "record")
    expect(page.get_by_role("button", name=re.compile("Confirm all suggestions"))).to_have_count(0)
    assert {r.tool: r.in_force for r in ToolRule.objects.all()} == {
        "read_file": "pass",
        "append_log": "record",
        write: "record",
    }
    shot(page, "tool-rules-confirmed")

    # A phone: nothing scrolls sideways, long names and descriptions wrap.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, width
    shot(page, "tool-rules-phone")


def test_a_viewer_sees_it_read_only(page: Any, viewer: User) -> None:
    gateway()
    login(page, "victor")
    page.goto(f"/agents/{AGENT}/")
    expect(
        page.get_by_text("Only admins can confirm the rules of an agent's tools.")
    ).to_be_visible()
    expect(card_of(page, "read_file")).to_contain_text("Says it only reads")
    expect(page.locator("form.tool-rule-form")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("Confirm all suggestions"))).to_have_count(0)


def test_without_javascript_a_row_is_added_and_the_rule_saved(new_page: Any) -> None:
    gateway()
    admin()
    page = new_page(javascript=False)
    page.goto("/login/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", "pw-ada")
    page.click("button[type=submit]")
    page.goto(f"/agents/{AGENT}/")
    card = card_of(page, "append_log")
    card.locator('input[name="pattern-0-argument"]').fill("line")
    card.locator('input[name="pattern-0-matches"]').fill("*secret*")
    card.get_by_role("button", name="Add a pattern row").click()
    card = card_of(page, "append_log")
    expect(card.locator('input[name="pattern-1-argument"]')).to_be_visible()
    expect(card.locator('input[name="pattern-0-matches"]')).to_have_value("*secret*")
    card.get_by_label("Rule", exact=True).select_option("record")
    card.get_by_role("button", name=re.compile("Confirm rule of")).click()
    expect(page.locator(".flash-success")).to_contain_text("Rule of append_log confirmed")
    row = ToolRule.objects.get(agent=AGENT, tool="append_log")
    assert (row.rule, row.patterns) == (
        "record",
        [{"argument": "line", "matches": "*secret*", "rule": "approve"}],
    )
