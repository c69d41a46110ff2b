"""The dashboard in a real browser: answering, approving, cancelling, retrying, stale tabs,
expiry, double clicks, the keyboard, side effects. The seed's demo agent runs end to end on
a real worker pool; the other tests play the worker's side through the same services a
worker calls, so each can put a run exactly where it needs it."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from ledger import services as ledger
from ledger.models import SideEffect
from runs import services
from runs.models import Attempt, InputRequest, Run, RunEvent
from runtime.worker import WorkerPool
from tests.browser.conftest import login, open_request, shot
from tests.dashboard.support import ask
from tests.dashboard.test_side_effects import a_run_with_effects
from tests.runs.factory import claim, epochs, start
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SEED_PROMPT = "请选择需要保持兼容的 Token 版本"
DEMO_AGENT = "auth-token-migration"
SEED_SCHEMA = {
    "type": "object",
    "properties": {
        "versions": {
            "type": "array",
            "title": "兼容版本",
            "description": "迁移期间仍被接受的旧版本",
            "items": {"type": "string", "enum": ["v1", "v2", "v3"]},
            "minItems": 1,
        },
        "grace_days": {"type": "integer", "title": "Grace days", "minimum": 1, "maximum": 90},
    },
    "required": ["versions", "grace_days"],
}


def seed_question(**kw: Any) -> tuple[Run, InputRequest]:
    run, _lease, _cp, req = ask(
        prompt=SEED_PROMPT,
        schema=SEED_SCHEMA,
        context={"service": "auth-gateway", "tokens_seen": {"v1": 1203, "v2": 88411}},
        step_id="choose_versions",
        **kw,
    )
    return run, req


def card(page: Any, req: InputRequest) -> Any:
    return open_request(page, req.id)


def attempts(run: Run) -> int:
    return Attempt.objects.filter(run=run).count()


def worker_finishes(run: Run) -> None:
    """The worker's side: claim the resumed attempt and complete it."""
    lease = claim("w-browser")
    assert lease.run_id == run.id
    services.attempt_complete(**epochs(lease), result={"kept": ["v2"]})


def test_it_logs_in_and_shows_every_page(
    new_page: Any, operator: User, approver: User, viewer: User
) -> None:
    run, req = seed_question()
    ask(
        kind="auth_required",
        prompt="Apply the new auth config to staging?",
        reason="Token v1 must stop being accepted before the key rotation.",
        action={
            "tool": "update_auth_config",
            "operation": "update",
            "target": "staging/auth/config",
            "reversibility": "irreversible",
            "before": {"accept": ["v1", "v2"], "ttl": 3600},
            "after": {"accept": ["v2"], "ttl": 1800},
        },
        step_id="apply_config",
    )
    page = new_page()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    shot(page, "login")
    login(page, "alice")
    expect(page.locator("#inbox-count")).to_have_text("2")
    expect(card(page, req).locator("h2")).to_have_text(SEED_PROMPT)
    # The absolute expiry is in the browser's zone (Asia/Shanghai is CST).
    expect(card(page, req)).to_contain_text("CST")
    # The inbox is rows: the approval's row opens with a click on its line.
    page.locator("#inbox-list details.row-details:not([open]) > summary").first.click()
    expect(
        page.get_by_role("button", name=re.compile("Approve update_auth_config"))
    ).to_be_visible()
    shot(page, "inbox")
    page.get_by_role("link", name="Runs").click()
    expect(page.locator(f"#run-{run.id}-row")).to_contain_text("Waiting for input")
    shot(page, "runs")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Waiting for input")
    page.locator(f"#run-{run.id}-checkpoints summary").first.click()
    expect(page.locator(f"#run-{run.id}-checkpoints pre").first).to_contain_text('"seen": 1')
    shot(page, "run-waiting")

    operator_page = new_page()
    login(operator_page, "olivia")
    operator_page.get_by_role("link", name="Start a run").click()
    operator_page.get_by_role("link", name=re.compile("test-agent")).click()
    operator_page.fill("input[name='answer/n']", "2.5")
    operator_page.get_by_role("button", name="Start test-agent").click()
    expect(operator_page.locator(".field-error")).to_have_text("Enter a whole number.")
    shot(operator_page, "start-invalid")
    operator_page.fill("input[name='answer/n']", "3")
    operator_page.get_by_role("button", name="Start test-agent").click()
    expect(operator_page.locator(".flash-success")).to_have_text("Run started.")
    assert Run.objects.filter(input={"n": 3}).count() == 1
    shot(operator_page, "run-started")

    viewer_page = new_page()
    login(viewer_page, "victor")
    viewer_page.goto(f"/runs/{run.id}/")
    expect(viewer_page.locator(".who-can")).to_contain_text("Only people who may answer")
    expect(viewer_page.get_by_role("button", name="Submit response")).to_be_disabled()
    shot(viewer_page, "run-viewer")


@pytest.fixture
def demo_worker(settings: Any, tmp_path: Any) -> Iterator[WorkerPool]:
    """A real worker pool in this process, running the seed's demo agent."""
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    pool = WorkerPool(1, [DEMO_AGENT], sweep_interval=0.2, lease_seconds=30).start()
    yield pool
    pool.stop(timeout=10)


def wait_for_request(page: Any, run_id: str, kind: str, not_id: str = "") -> InputRequest:
    """Wait until the run waits on a new request of ``kind``, and the open run page shows
    it without a reload (the page is live)."""

    def asked() -> InputRequest | None:
        run = Run.objects.get(pk=run_id)
        if run.pending_request_id and run.pending_request_id != not_id:
            req = InputRequest.objects.get(pk=run.pending_request_id)
            if req.kind == kind:
                return req
        assert run.status not in ("failed", "cancelled"), run.failure_detail
        return None

    req = wait_for(asked, 20, f"a new {kind} request on {run_id}", interval=0.1)
    expect(page.locator(f"#request-{req.id}")).to_be_visible()
    return req


def assert_decided(request_id: str, username: str, answer: dict[str, Any] | None = None) -> None:
    """The click's POST may still be in flight (an earlier flash can match): wait for it."""
    wait_for(
        lambda: InputRequest.objects.get(pk=request_id).status != "pending",
        15,
        f"{request_id} to be decided",
    )
    request = InputRequest.objects.select_related("answered_by").get(pk=request_id)
    assert request.status == "answered"
    assert request.answered_by is not None and request.answered_by.username == username
    if answer is not None:
        assert request.answer == answer


def test_it_runs_the_seed_demo_end_to_end(
    new_page: Any, operator: User, approver: User, demo_worker: WorkerPool, mailoutbox: Any
) -> None:
    """Start the demo agent, answer its Chinese question, approve its config change and
    its e-mail, and watch the run resume after each answer until it succeeds."""
    page = new_page()
    login(page, "olivia")
    page.get_by_role("link", name="Start a run").click()
    page.get_by_role("link", name=re.compile(DEMO_AGENT)).click()
    page.get_by_label(re.compile("Notify")).fill("auth-team@example.com")
    shot(page, "start")
    page.get_by_role("button", name=f"Start {DEMO_AGENT}").click()
    expect(page.locator(".flash-success")).to_have_text("Run started.")
    run_id = re.search(r"/runs/(run_[0-9A-Z]+)/", page.url).group(1)  # type: ignore[union-attr]

    question = wait_for_request(page, run_id, "input_required")
    expect(page.locator(f"#run-{run_id}-status")).to_have_text("Waiting for input")
    card = page.locator(f"#request-{question.id}")
    expect(card.locator("h2")).to_have_text(SEED_PROMPT)
    expect(card).to_contain_text("available_versions")
    shot(page, "seed-question")
    card.locator("input[name='answer/versions']").first.fill("v2")
    card.get_by_role("button", name="+ Add another").click()
    card.locator("input[name='answer/versions']").nth(1).fill("v3")
    card.get_by_role("button", name="Submit response").click()
    expect(page.locator(f"#run-{run_id}-main .flash-success")).to_contain_text("Answer sent.")
    # The in-process worker may already have reached the next hold point when the reply is
    # drawn, so the page can show the next card: check the decision where it is recorded,
    # and on the live timeline.
    assert_decided(question.id, "olivia")
    answered = page.locator(f"#run-{run_id}-timeline li[data-type='request.answered']")
    expect(answered.first).to_contain_text("olivia")
    assert Attempt.objects.get(run_id=run_id, number=2).reason == "resume"

    # The run resumes on the worker and stops again at the approval of the config change.
    approval = wait_for_request(page, run_id, "auth_required", not_id=question.id)
    expect(page.locator(f"#request-{approval.id} h2")).to_have_text(
        "Update staging/auth/config via update_auth_config"
    )
    expect(page.locator(f"#request-{approval.id} .diff-add")).to_contain_text(
        'accepted_versions: ["v2", "v3"]'
    )
    expect(page.locator(f"#request-{approval.id} .who-can")).to_contain_text("Only approvers")
    shot(page, "seed-approval-operator")
    alice = new_page()
    login(alice, "alice")
    alice.goto(f"/runs/{run_id}/")
    alice.locator(f"#request-{approval.id}").get_by_label(re.compile("Comment")).fill("SEC-2291")
    alice.get_by_role("button", name="Approve and run update_auth_config").click()
    expect(alice.locator(f"#run-{run_id}-main .flash-success")).to_contain_text("Approved.")
    assert_decided(approval.id, "alice", {"decision": "approve", "comment": "SEC-2291"})

    # E-mail cannot be undone: the ledger asks before the run sends it.
    email = wait_for_request(alice, run_id, "auth_required", not_id=approval.id)
    card = alice.locator(f"#request-{email.id}")
    expect(card.locator(".chip-danger")).to_have_text("Cannot be undone")
    shot(alice, "seed-email-approval")
    card.get_by_role("button", name=re.compile("cannot be undone")).click()
    expect(alice.locator(f"#run-{run_id}-main .flash-success")).to_contain_text("Approved.")
    assert_decided(email.id, "alice")
    wait_for(
        lambda: Run.objects.get(pk=run_id).status == "succeeded",
        20,
        f"{run_id} to succeed",
        interval=0.1,
    )
    # No reload: the page follows the run, and fetches the side-effect report again.
    expect(alice.locator(f"#run-{run_id}-status")).to_have_text("Succeeded")
    expect(alice.locator(f"#run-{run_id}-report")).to_contain_text("Cannot be undone")
    assert [m.to for m in mailoutbox] == [["auth-team@example.com"]]
    shot(alice, "seed-succeeded")


def test_it_resumes_once_on_a_double_click(new_page: Any, operator: User) -> None:
    run, req = seed_question()
    # Both questions first: a resumed run is queued, and the next ask() would claim it.
    run2, req2 = seed_question()
    page = new_page()
    login(page, "olivia")
    form = card(page, req)
    form.get_by_label("v1").check()
    form.get_by_label("Grace days").fill("7")
    form.get_by_role("button", name="Submit response").dblclick()
    expect(form).to_contain_text("Answered by olivia at")
    page.wait_for_timeout(300)
    assert attempts(run) == 2
    assert RunEvent.objects.filter(run=run, type="run.resumed").count() == 1
    # Without JavaScript a double click sends the form twice, with the same key.
    plain = new_page(javascript=False)
    login(plain, "olivia")
    form = card(plain, req2)
    form.get_by_label("v3").check()
    form.get_by_label("Grace days").fill("7")
    form.get_by_role("button", name="Submit response").dblclick()
    plain.wait_for_load_state()
    # The second POST carried the same key, so it got the first one's outcome back.
    expect(plain.locator(".flash-success").first).to_have_text(
        "Answer sent. The run resumes in a new attempt."
    )
    expect(plain.locator(".flash-error")).to_have_count(0)
    assert attempts(run2) == 2
    assert RunEvent.objects.filter(run=run2, type="run.resumed").count() == 1
    shot(plain, "double-click-without-js")


def test_it_approves_and_denies(page: Any, approver: User) -> None:
    irreversible_run, irreversible = ask(
        kind="auth_required",
        prompt="Apply the new auth config to staging?",
        action={
            "tool": "update_auth_config",
            "operation": "update",
            "target": "staging/auth/config",
            "reversibility": "irreversible",
            "before": {"ttl": 3600},
            "after": {"ttl": 1800},
        },
        expires_in=600,
    )[::3]
    _run, compensable = ask(
        kind="auth_required",
        prompt="Send the weekly report?",
        action={
            "tool": "webhook",
            "target": "https://hooks.example.com/reports",
            "reversibility": "compensable",
            "compensating_action": "post a retraction",
        },
        expires_in=1200,
    )[::3]
    login(page, "alice")
    first = card(page, irreversible)
    expect(first.locator(".request-head .chip-danger")).to_have_text("Cannot be undone")
    expect(first.locator(".diff-add")).to_contain_text('"ttl": 1800')
    shot(page, "approval-card")
    first.get_by_role("button", name="Approve update_auth_config — cannot be undone").click()
    expect(first).to_contain_text("Approved by alice at")
    second = card(page, compensable)
    expect(second).to_contain_text("Can be undone: post a retraction")
    second.get_by_role("button", name="Deny webhook").click()
    expect(second.locator(".field-error")).to_contain_text("Say why you deny it")
    second.get_by_label(re.compile("Comment")).fill("Wrong week")
    second.get_by_role("button", name="Deny webhook").click()
    expect(second).to_contain_text("Denied by alice at")
    expect(second).to_contain_text("Wrong week")
    expect(page.locator("#inbox-count")).to_have_text("0")
    shot(page, "approvals-decided")
    irreversible.refresh_from_db()
    compensable.refresh_from_db()
    assert irreversible.answer == {"decision": "approve"}
    assert compensable.answer == {"decision": "deny", "comment": "Wrong week"}
    assert Run.objects.get(pk=irreversible_run.id).status == "queued"


def test_it_cancels_a_running_run(page: Any, operator: User) -> None:
    run = start()
    lease = claim()
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Running")
    page.get_by_text("Cancel run…").click()
    page.get_by_label(re.compile("Reason")).fill("Wrong service")
    shot(page, "cancel-dialog")
    page.get_by_role("button", name="Cancel this run").click()
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Cancelling…")
    expect(page.locator(".flash-success")).to_contain_text("Cancel accepted")
    # The worker learns of it at its next heartbeat and stops.
    assert services.attempt_heartbeat(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch
    ).cancel_requested
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="cancelled"
    )
    # No reload: the page shows the run cancelled once the worker has stopped.
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Cancelled")
    expect(page.locator(".banner-muted")).to_contain_text("Wrong service")
    shot(page, "run-cancelled")


def test_it_retries_a_failed_run_from_an_earlier_checkpoint(page: Any, operator: User) -> None:
    run = start()
    lease = claim()
    first = services.checkpoint_save(**epochs(lease), step="collect", state={"rows": 120})
    services.checkpoint_save(**epochs(lease), step="render", state={"rows": 120, "chart": True})
    services.attempt_fail(
        **epochs(lease), error={"type": "ValueError", "message": "width -3", "step": "render"}
    )
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Failed (needs new information)")
    shot(page, "run-failed")
    page.get_by_text("Retry…").click()
    page.get_by_label("Continue from").select_option(first.id)
    page.get_by_label(re.compile("Reason")).fill("Collect again with the fixed query")
    page.get_by_role("button", name="Retry this run").click()
    expect(page.locator(".flash-success")).to_have_text(
        "Retry queued: attempt 2 continues from checkpoint #1."
    )
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Queued")
    row = page.locator(f"#run-{run.id}-attempts tr[data-attempt='2']")
    expect(row).to_contain_text("Retry")
    expect(row).to_contain_text("collect")
    attempt = Attempt.objects.get(run=run, number=2)
    assert attempt.resume_from_id == first.id
    shot(page, "run-retried")


def test_it_refuses_an_expired_prompt_with_a_clear_message(page: Any, operator: User) -> None:
    _run, req = seed_question(expires_in=3600)
    _run2, soon = seed_question(expires_in=4)
    login(page, "olivia")
    form = card(page, req)
    form.get_by_label("v1").check()
    form.get_by_label("Grace days").fill("3")
    # The deadline passes while the page is open (the page does not know yet).
    InputRequest.objects.filter(pk=req.id).update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    form.get_by_role("button", name="Submit response").click()
    expect(form.locator(".flash-error")).to_contain_text("This request expired at")
    expect(form.locator(".flash-error")).to_contain_text("it can no longer be answered")
    expect(form.locator("form")).to_have_count(0)
    assert InputRequest.objects.get(pk=req.id).status == "pending"
    # A countdown that reaches zero disables its form before anyone types.
    ticking = card(page, soon)
    expect(ticking.locator(".request-head time[data-countdown]")).to_have_text(
        "Expired", timeout=8000
    )
    # Disabled in place, or (when a live push redrew the list after the deadline) no form
    # at all: either way nothing can be sent.
    expect(ticking.locator("button[type=submit]:enabled")).to_have_count(0)
    shot(page, "expired")


def test_it_tells_a_stale_second_tab_who_answered(
    new_page: Any, operator: User, approver: User
) -> None:
    run, req = seed_question()
    first = new_page()
    second = new_page()
    # The second tab is stale: its live socket is down (pushes would update it at once).
    second.context.route_web_socket(re.compile(r".*/ws/.*"), lambda ws: None)
    login(first, "alice")
    login(second, "olivia")
    card(second, req).get_by_label("v3").check()
    card(second, req).get_by_label("Grace days").fill("5")
    card(first, req).get_by_label("v2").check()
    card(first, req).get_by_label("Grace days").fill("10")
    card(first, req).get_by_role("button", name="Submit response").click()
    expect(card(first, req)).to_contain_text("Answered by alice at")
    card(second, req).get_by_role("button", name="Submit response").click()
    answered = timezone.localtime(
        InputRequest.objects.get(pk=req.id).answered_at, dt.timezone(dt.timedelta(hours=8))
    )
    expect(card(second, req).locator(".flash-error p").first).to_have_text(
        f"Already answered by alice at {answered:%H:%M}."
    )
    expect(card(second, req)).to_contain_text("v2")
    assert attempts(run) == 2
    shot(second, "stale-tab")


def test_it_can_be_answered_with_the_keyboard_alone(page: Any, operator: User) -> None:
    _run, req = seed_question()
    login(page, "olivia")
    page.locator("body").focus()
    target = f"#request-{req.id} input[type=checkbox][value='1']"
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate(f"document.activeElement === document.querySelector({target!r})"):
            break
    else:
        pytest.fail("Tab never reached the first answer field")
    page.keyboard.press("Space")
    for _ in range(5):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.name") == "answer/grace_days":
            break
    page.keyboard.type("12")
    page.keyboard.press("Control+Enter")
    expect(card(page, req)).to_contain_text("Answered by olivia at")
    req.refresh_from_db()
    assert req.answer == {"versions": ["v2"], "grace_days": 12}


def test_it_keeps_injected_markup_inert(page: Any, operator: User) -> None:
    evil = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"
    run, req = ask(prompt=evil, context={"note": evil}, state={"html": evil})[::3]
    login(page, "olivia")
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    expect(card(page, req).locator("h2")).to_have_text(evil)
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(f"#request-{req.id} h2")).to_have_text(evil)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#main img").count() == 0
    assert dialogs == []


def test_it_reconciles_an_unknown_side_effect_and_then_retries(
    page: Any, operator: User, settings: Any, tmp_path: Any
) -> None:
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    run, effects = a_run_with_effects(settings.HOLDPOINT_CONFIG_STORE_DIR)
    unknown = effects["unknown"]
    login(page, "olivia")
    page.get_by_role("link", name="Side effects").click()
    expect(page.locator(f"#effect-{unknown.operation_id}")).to_contain_text(
        "Unknown — needs reconciliation"
    )
    shot(page, "side-effects")
    page.goto(f"/side-effects/runs/{run.id}/")
    expect(page.locator(".report-summary")).to_contain_text("1 Unknown — needs reconciliation")
    shot(page, "side-effect-report")
    page.goto(f"/runs/{run.id}/")
    banner = page.locator(f"#run-{run.id}-effects-banner")
    expect(banner).to_contain_text("1 side effect needs reconciliation")
    expect(page.get_by_role("button", name="Retry…")).to_be_disabled()
    shot(page, "run-side-effect-unknown")
    effect = page.locator(f"#effect-{unknown.operation_id}")
    effect.get_by_role("button", name="Mark not happened").click()
    expect(effect.locator(".field-error")).to_contain_text("Say what you checked")
    page.locator(f"#effect-{unknown.operation_id}").get_by_label(re.compile("Note")).fill(
        "No delivery in the receiver's log"
    )
    page.locator(f"#effect-{unknown.operation_id}").get_by_role(
        "button", name="Mark not happened"
    ).click()
    told = page.locator(f"#run-{run.id}-report .flash-success")
    expect(told).to_contain_text("Marked as not happened.")
    expect(banner).to_be_empty()
    # Another side-effect change of the run redraws the report (a live push): the person's
    # confirmation stays. (The push of the reconciliation itself can come after its reply,
    # as it does on a loaded machine; this is that order, made certain.)
    ledger.side_effect_compensate(
        operation_id=effects["happened"].operation_id, user=operator, reason="roll back"
    )
    expect(page.locator(f"#run-{run.id}-report")).to_contain_text("1 Compensated")
    expect(told).to_contain_text("Marked as not happened.")
    page.get_by_text("Retry…").click()
    expect(page.locator(".retry-preview")).to_contain_text("may be attempted again")
    page.locator("#retry-reason").fill("The hook did not fire; send it again")
    page.get_by_role("button", name="Retry this run").click()
    expect(page.locator(".flash-success")).to_contain_text("Retry queued: attempt 2")
    assert SideEffect.objects.get(pk=unknown.pk).status == "failed"
    assert Attempt.objects.get(run=run, number=2).reason == "retry"
    shot(page, "run-reconciled-and-retried")
