"""Issue 15 in Chromium: the dashboard never misleads a person. One test (or two) per
numbered point, each failing on the dashboard before the issue: required fields, lists
without JavaScript, decisions that stick, undo that looks first, the audit trail, inbox
rows, the phone, words for people, Chinese, and messages that follow the state."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools.config_store import ConfigStoreTool
from runs import services
from runs.models import InputRequest, Run
from runtime.executor import Outcome
from tests.browser.conftest import login, shot
from tests.dashboard.support import ask
from tests.dashboard.test_side_effects import a_run_with_effects
from tests.runs.factory import claim, epochs, start
from tests.runtime.conftest import fresh, make_agent, run_next  # noqa: F401 - fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ACTION = {
    "tool": "config_store",
    "action": "update_auth_config",
    "target": "staging/auth/config",
    "change": {"accepted_versions": {"from": ["v1", "v2"], "to": ["v2"]}},
    "reversibility": "reversible",
}


@pytest.fixture
def config_dir(settings: Any, tmp_path: Path) -> Path:
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    return settings.HOLDPOINT_CONFIG_STORE_DIR


def row(page: Any, req: InputRequest) -> Any:
    return page.locator(f"#request-{req.id}")


def open_row(page: Any, req: InputRequest) -> Any:
    """Open the inbox row of ``req`` (a click on its one line) and return it."""
    found = row(page, req)
    if found.locator("details.row-details").get_attribute("open") is None:
        found.locator("summary.row-line").click()
    return found


def no_sideways_scroll(page: Any) -> None:
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], f"{page.url} scrolls sideways: {widths}"


# --- 1. Required means not empty -----------------------------------------------------------


@pytest.mark.parametrize("javascript", [True, False])
def test_1_a_required_list_cannot_be_sent_empty(
    new_page: Any, operator: User, javascript: bool
) -> None:
    _run, _lease, _cp, req = ask(schema={"versions": "string[]"})
    page = new_page(javascript=javascript)
    login(page, "olivia")
    card = open_row(page, req)
    card.get_by_role("button", name="Submit response").click()
    expect(card.locator(".field-error")).to_contain_text("This field is required.")
    req.refresh_from_db()
    assert req.status == "pending" and req.answer is None
    shot(page, f"issue15-1-required-{'js' if javascript else 'nojs'}")


# --- 2. Lists without JavaScript are one value per line -----------------------------------


@pytest.mark.parametrize("javascript", [True, False])
def test_2_two_list_values_are_stored_as_two(
    new_page: Any, operator: User, javascript: bool
) -> None:
    _run, _lease, _cp, req = ask(schema={"versions": "string[]"})
    page = new_page(javascript=javascript)
    login(page, "olivia")
    card = open_row(page, req)
    if javascript:
        inputs = card.locator("[data-list-input]")
        inputs.first.fill("v2")
        card.get_by_role("button", name="+ Add another").click()
        inputs.nth(1).fill("v3")
    else:
        expect(card.locator("[data-list] legend")).to_contain_text("(one per line)")
        card.locator("textarea[data-list-text]").fill("v2\nv3")
    card.get_by_role("button", name="Submit response").click()
    expect(page.locator(".flash-success").first).to_contain_text("Answer sent")
    req.refresh_from_db()
    assert req.answer == {"versions": ["v2", "v3"]}


# --- 3. A decision sticks and is visible ---------------------------------------------------


def test_3_a_re_ask_after_a_denial_shows_the_earlier_decision(page: Any, approver: User) -> None:
    run, _lease, _cp, first = ask(kind="auth_required", action=ACTION, step_id="approve.approve")
    services.run_resume(
        run_id=run.id,
        request_id=first.id,
        checkpoint_id=first.checkpoint_id,
        value={"decision": "deny", "comment": "not during the freeze"},
        user=approver,
    )
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="approve", state={})
    again = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt="Approve update_auth_config on staging/auth/config?",
        accepted_schema=None,
        expires_in=3600,
        action={
            **ACTION,
            "change": {"accepted_versions": {"from": ["v1", "v2", "v3"], "to": ["v2"]}},
        },
        step_id="approve.approve-v4",
    )
    login(page, "alice")
    line = row(page, again).locator("summary.row-line")
    expect(line).to_contain_text("Asked again after a denial")
    card = open_row(page, again)
    earlier = card.locator("[data-earlier]")
    expect(earlier).to_contain_text("Denied")
    expect(earlier).to_contain_text("by alice")
    expect(earlier).to_contain_text("not during the freeze")
    earlier.get_by_text("What they saw").click()
    expect(earlier.locator(".diff")).to_contain_text('"v1"')
    shot(page, "issue15-3-reask")


def test_3_an_empty_change_is_not_asked_and_the_timeline_says_why(
    page: Any,
    operator: User,
    make_agent: Any,  # noqa: F811
) -> None:
    agent = make_agent()

    @agent.step
    def change(ctx: Any, state: Any) -> Any:
        approval = ctx.approve(
            "update_auth_config", "staging/auth/config", {"v": {"from": 1, "to": 1}}
        )
        return ctx.done({"unchanged": approval.unchanged})

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert not InputRequest.objects.filter(run=run).exists()
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(".timeline")).to_contain_text("the planned change is empty")


# --- 4. Undo says what it will do, and warns when the world moved on ------------------------


def test_4_undo_needs_a_reason_shows_the_change_and_warns_when_the_target_moved(
    page: Any, operator: User, config_dir: Path
) -> None:
    run, effects = a_run_with_effects(config_dir)
    happened = effects["happened"]
    ConfigStoreTool().store().write(
        "staging/auth/config", {"ttl": 90, "by": "another run"}, idempotency_key="other-run"
    )
    login(page, "olivia")
    page.goto(f"/side-effects/runs/{run.id}/")
    effect = page.locator(f"#effect-{happened.operation_id}")
    effect.get_by_text("Undo…").click()
    expect(effect.locator(".compensate-warning")).to_contain_text(
        "The target changed after this effect."
    )
    expect(effect.locator(".diff")).to_contain_text("another run")
    assert "compensating_action" not in effect.inner_text()
    shot(page, "issue15-4-undo")
    effect.get_by_role("button", name=re.compile("^(Restore|Undo)")).click()
    effect = page.locator(f"#effect-{happened.operation_id}")
    expect(effect.locator(".field-error").first).to_contain_text("Say why you undo it")
    effect.get_by_label(re.compile("Reason")).fill("the rotation broke logins")
    effect.get_by_role("button", name=re.compile("^(Restore|Undo)")).click()
    effect = page.locator(f"#effect-{happened.operation_id}")
    expect(effect.locator(".field-error").first).to_contain_text("Restore anyway")
    assert SideEffect.objects.get(pk=happened.pk).status == "confirmed"
    effect.get_by_label(re.compile("Reason")).fill("the rotation broke logins")
    effect.get_by_label(re.compile("Restore anyway")).check()
    effect.get_by_role("button", name=re.compile("^(Restore|Undo)")).click()
    expect(page.locator(f"#run-{run.id}-report .flash-success")).to_contain_text("Undone")
    done = SideEffect.objects.get(pk=happened.pk)
    assert done.status == "compensated" and done.compensation_reason == "the rotation broke logins"


# --- 5. The audit trail is complete --------------------------------------------------------


def test_5_a_config_write_approved_with_a_comment_shows_who_approved(
    page: Any, approver: User, operator: User, config_dir: Path
) -> None:
    run, _lease, _cp, req = ask(kind="auth_required", action=ACTION, step_id="write.approve")
    services.run_resume(
        run_id=run.id,
        request_id=req.id,
        checkpoint_id=req.checkpoint_id,
        value={"decision": "approve", "comment": "after the freeze"},
        user=approver,
    )
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease),
        step_id="write.config_store",
        tool="config_store",
        target="staging/auth/config",
        request={"document": "staging/auth/config", "content": {"accepted_versions": ["v2"]}},
    ).side_effect
    login(page, "olivia")
    page.goto(f"/side-effects/runs/{run.id}/")
    approved = page.locator(f"#effect-{done.operation_id} [data-approval]")
    expect(approved).to_contain_text("alice")
    expect(approved).to_contain_text("after the freeze")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(f"#effect-{done.operation_id} [data-approval]")).to_contain_text("alice")
    shot(page, "issue15-5-audit")


# --- 6. The inbox scans --------------------------------------------------------------------


def test_6_the_inbox_is_rows_grouped_and_keyboard_driven(page: Any, operator: User) -> None:
    _a, _l, _c, first = ask(prompt="Which versions stay?", expires_in=600)
    _b, _l, _c, second = ask(prompt="Which versions stay?", expires_in=1200)
    run_c, _l, _c, third = ask(prompt="Pick a window", expires_in=1800)
    login(page, "olivia")
    rows = page.locator("#inbox-list summary.row-line")
    # One group of the two identical questions (with its count) and one row.
    group = page.locator("details.inbox-group")
    expect(group).to_have_count(1)
    expect(group.locator("> summary")).to_contain_text("\u00d72")
    line = row(page, third).locator("summary.row-line")
    expect(line).to_contain_text("Pick a window")
    expect(line).to_contain_text(run_c.label)
    expect(line).to_contain_text("left")
    # The most urgent opens at once; its height is one card, not seven.
    expect(row(page, first).locator("details.row-details")).to_have_attribute("open", "")
    expect(row(page, third).locator("details.row-details")).not_to_have_attribute("open", "")
    shot(page, "issue15-6-inbox")
    # Keyboard: Esc closes, ↓ moves, Enter opens.
    row(page, first).locator("[data-list-input]").first.focus()
    page.keyboard.press("Escape")
    expect(row(page, first).locator("details.row-details")).not_to_have_attribute("open", "")
    expect(row(page, first).locator("summary.row-line")).to_be_focused()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    expect(line).to_be_focused()
    page.keyboard.press("Enter")
    expect(row(page, third).locator("details.row-details")).to_have_attribute("open", "")
    # Answering opens the next pending row and puts focus in its first field.
    card = open_row(page, first)
    card.locator("[data-list-input]").first.fill("v2")
    card.get_by_role("button", name="Submit response").click()
    expect(row(page, first).locator(".flash-success")).to_contain_text("Answer sent")
    expect(row(page, second).locator("details.row-details")).to_have_attribute("open", "")
    expect(row(page, second).locator("[data-list-input]").first).to_be_focused()
    assert rows.count() >= 3


def test_6_runs_carry_a_human_label_everywhere(page: Any, operator: User) -> None:
    run, _l, _c, _req = ask(prompt="Which versions stay?")
    login(page, "olivia")
    page.goto("/runs/")
    expect(page.locator(f"#run-{run.id}-row")).to_contain_text(run.label)
    page.goto(f"/runs/{run.id}/")
    expect(page.locator("h1")).to_contain_text(run.label)
    assert run.label in page.title()
    page.goto(f"/side-effects/runs/{run.id}/")
    assert run.label in page.title()


# --- 7. Phone: nothing scrolls sideways at 390 px ------------------------------------------


@pytest.mark.parametrize("javascript", [True, False])
def test_7_no_page_scrolls_sideways_on_a_phone(
    browser: Any, live_server: Any, operator: User, config_dir: Path, javascript: bool
) -> None:
    run, _effects = a_run_with_effects(config_dir)
    long_target = "staging/" + "very-long-segment-" * 8
    ask(
        kind="auth_required",
        action={**ACTION, "target": long_target, "arguments": {"url": "https://" + "x" * 120}},
        prompt="Approve?",
    )
    context = browser.new_context(
        base_url=live_server.url,
        viewport={"width": 390, "height": 844},
        java_script_enabled=javascript,
        timezone_id="Asia/Shanghai",
    )
    page = context.new_page()
    try:
        login(page, "olivia")
        expect(page.locator("#main-nav")).to_be_hidden()
        page.locator(".nav-toggle-label").click()
        expect(page.locator("#main-nav")).to_be_visible()
        for url in [
            "/",
            "/?tab=all",
            "/runs/",
            f"/runs/{run.id}/",
            "/side-effects/",
            "/side-effects/?tab=all",
            f"/side-effects/runs/{run.id}/",
            "/runs/new",
        ]:
            page.goto(url)
            for summary in page.locator("details:not([open]) > summary").all()[:6]:
                if summary.is_visible():
                    summary.click()
            no_sideways_scroll(page)
            shot(
                page,
                f"issue15-7-phone{'' if javascript else '-nojs'}-{url.strip('/').replace('/', '-') or 'inbox'}",
            )
    finally:
        context.close()


# --- 8. Words for people -------------------------------------------------------------------


def test_8_words_not_machine_text(page: Any, operator: User, config_dir: Path) -> None:
    run, _l, _c, req = ask(
        schema={
            "type": "object",
            "properties": {
                "notify": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+$", "format": "email"}
            },
            "required": ["notify"],
        },
        context={"versions": ["v1", "v2"], "tokens_seen": {"v1": 1203, "v2": 88411}},
    )
    login(page, "olivia")
    card = open_row(page, req)
    card.get_by_label(re.compile("Notify")).fill("nobody")
    card.get_by_role("button", name="Submit response").click()
    card = row(page, req)
    expect(card.locator(".field-error")).to_have_text("Must be an e-mail address.")
    assert "^[^@" not in card.inner_text()
    # JSON values read as lists and tables, not braces.
    expect(card.locator(".context")).to_contain_text("v1, v2")
    assert "{" not in card.locator(".context").inner_text()
    # Epochs live in the details area.
    page.goto(f"/runs/{run.id}/")
    expect(page.get_by_text("Lease epoch")).to_have_count(0)
    expect(page.locator(".run-details")).to_contain_text("Technical details")
    assert "epoch" not in page.locator(".timeline").inner_text()


def test_8_an_irreversible_approval_gives_its_reason_as_a_sentence(
    page: Any, approver: User
) -> None:
    _run, _l, _c, req = ask(
        kind="auth_required",
        action={
            "tool": "email",
            "action": "email",
            "target": "ops@example.com",
            "reversibility": "irreversible",
        },
        prompt="Approve email on ops@example.com? It cannot be undone.",
        reason="email on ops@example.com cannot be undone; step 'notify.email' needs an approval first.",
    )
    login(page, "alice")
    card = open_row(page, req)
    expect(card.locator(".request-reason")).to_contain_text(
        "email on ops@example.com cannot be undone, so a person decides before it runs."
    )
    assert "needs an approval first" not in card.inner_text()


# --- 9. Chinese without jargon, the agent's text untouched ---------------------------------


def test_9_chinese_pages_speak_chinese_and_keep_the_agents_words(
    page: Any, approver: User, operator: User
) -> None:
    run, _l, _c, req = ask(
        kind="auth_required",
        action={
            "tool": "email",
            "action": "email",
            "target": "ops@example.com",
            "reversibility": "irreversible",
        },
        prompt="Approve email on ops@example.com? It cannot be undone.",
        reason="email on ops@example.com cannot be undone; step 'notify.email' needs an approval first.",
    )
    ask(prompt="Deploy window, please (agent's own English)", schema={"window": "string"})
    login(page, "alice")
    page.locator("#language").select_option("zh-hans")
    page.wait_for_load_state()
    expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
    expect(page.locator("#inbox-list")).to_contain_text(
        "Deploy window, please (agent's own English)"
    )
    card = open_row(page, req)
    expect(card.locator(".request-reason")).to_contain_text("无法撤销")
    assert "cannot be undone" not in card.locator(".request-reason").inner_text()
    page.goto(f"/runs/{run.id}/")
    body = page.locator("body").inner_text()
    assert "租约纪元" not in body and "纪元" not in body
    assert "Technical details" not in body


# --- 10. Messages follow the state ---------------------------------------------------------


def test_10_cancel_accepted_leaves_when_the_run_shows_cancelled(page: Any, operator: User) -> None:
    run = start()
    lease = claim()
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    page.get_by_text("Cancel run…").click()
    page.get_by_label(re.compile("Reason")).fill("Wrong service")
    page.get_by_role("button", name="Cancel this run").click()
    expect(page.locator(".flash-success")).to_contain_text("Cancel accepted")
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="cancelled"
    )
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Cancelled")
    expect(page.get_by_text("Cancel accepted")).to_have_count(0)


def test_10_retry_queued_does_not_sit_beside_a_red_failed(page: Any, operator: User) -> None:
    run = start()
    lease = claim()
    services.attempt_fail(
        **epochs(lease), error={"type": "ValueError", "message": "bad", "step": "s"}
    )
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    page.get_by_text("Retry…").click()
    page.get_by_label(re.compile("Reason")).fill("again")
    page.get_by_role("button", name="Retry this run").click()
    expect(page.locator(".flash-success")).to_contain_text("Retry queued")
    again = claim()
    services.attempt_fail(
        **epochs(again), error={"type": "ValueError", "message": "bad", "step": "s"}
    )
    expect(page.locator(f"#run-{run.id}-status")).to_contain_text("Failed")
    expect(page.get_by_text("Retry queued:")).to_have_count(0)


def test_10_the_tab_count_follows_a_reconcile(page: Any, operator: User, config_dir: Path) -> None:
    _run, effects = a_run_with_effects(config_dir)
    login(page, "olivia")
    page.goto("/side-effects/")
    count = page.locator("#effects-needs-count")
    expect(count).to_have_text("1")
    effect = page.locator(f"#effect-{effects['unknown'].operation_id}")
    effect.get_by_label(re.compile("Note")).fill("Checked the receiver's log")
    effect.get_by_role("button", name="Mark not happened").click()
    expect(count).to_have_text("0")


def test_10_a_favicon_and_times_with_their_zone_without_javascript(
    new_page: Any, operator: User
) -> None:
    run, _l, _c, _req = ask()
    page = new_page(javascript=False)
    login(page, "olivia")
    assert page.locator("link[rel=icon]").count() == 1
    icon = page.request.get("/favicon.ico")
    assert icon.ok and "svg" in icon.headers["content-type"]
    page.goto("/runs/")
    created = page.locator(f"#run-{run.id}-row td").nth(4)
    expect(created).to_have_text(re.compile(r"\d\d:\d\d [A-Z+\-0-9]+$"))
    assert Run.objects.filter(pk=run.pk).exists()
