"""The runs list and the run page: filters, pages, panels, cancel and retry."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.models import Attempt, Run, RunEvent
from runs.services import register_retry_guard
from runs.services.control import _retry_guards
from tests.dashboard.support import HTMX, ask, text
from tests.runs.factory import claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db


def run_ids(html: str) -> list[str]:
    return re.findall(r'<tr id="run-(run_[0-9A-Z]+)-row">', html)


def failed_run(checkpoints: int = 2) -> tuple[Run, list]:
    run = start()
    lease = claim()
    cps = [
        services.checkpoint_save(**epochs(lease), step=f"step{i}", state={"i": i})
        for i in range(1, checkpoints + 1)
    ]
    services.attempt_fail(
        **epochs(lease), error={"type": "ValueError", "message": "bad value 42", "step": "step2"}
    )
    run.refresh_from_db()
    assert run.status == "failed"
    return run, cps


def test_it_lists_runs_newest_first_with_counts_per_status(client: Client, viewer: User) -> None:
    waiting, *_ = interrupted()
    second = start()
    third = start()
    client.force_login(viewer)
    html = client.get("/runs/").content.decode()
    assert run_ids(html) == [third.id, second.id, waiting.id]
    assert re.search(r'>All <span class="tab-count">3</span>', html)
    assert re.search(r'>Queued <span class="tab-count">2</span>', html)
    assert re.search(r'>Waiting for input <span class="tab-count">1</span>', html)
    html = client.get("/runs/?status=input_required").content.decode()
    assert run_ids(html) == [waiting.id]
    # The counts stay those of the other filters, so the tabs say where the runs are.
    assert re.search(r'>Queued <span class="tab-count">2</span>', html)


def test_tab_counts_stop_at_a_cap_instead_of_scanning_every_run(
    client: Client, viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard.pages import runs as run_pages

    monkeypatch.setattr(run_pages, "COUNT_CAP", 2)
    for _ in range(3):
        start()
    interrupted()
    client.force_login(viewer)
    html = client.get("/runs/").content.decode()
    assert re.search(r'>All <span class="tab-count">2\+</span>', html)
    assert re.search(r'>Queued <span class="tab-count">2\+</span>', html)
    assert re.search(r'>Waiting for input <span class="tab-count">1</span>', html)


def test_it_filters_by_agent_and_searches_by_id(client: Client, viewer: User) -> None:
    run = start()
    other = start()
    client.force_login(viewer)
    assert run_ids(client.get("/runs/?agent=nobody").content.decode()) == []
    assert "No runs match these filters." in client.get("/runs/?agent=nobody").content.decode()
    assert len(run_ids(client.get("/runs/?agent=test-agent").content.decode())) == 2
    prefix = run.id[:-4]
    found = run_ids(client.get(f"/runs/?q={prefix}").content.decode())
    assert run.id in found
    # A full id goes straight to its run.
    response = client.get(f"/runs/?q={other.id}")
    assert response.status_code == 302 and response["Location"] == f"/runs/{other.id}/"
    # htmx swaps only the table.
    partial = client.get("/runs/?agent=test-agent", HTTP_HX_TARGET="runs-table", **HTMX)
    assert partial.content.decode().lstrip().startswith('<div id="runs-table">')


def test_it_pages_with_a_cursor(client: Client, viewer: User) -> None:
    runs = [start() for _ in range(27)]
    client.force_login(viewer)
    html = client.get("/runs/").content.decode()
    page1 = run_ids(html)
    assert page1 == [r.id for r in reversed(runs)][:25]
    next_url = re.search(r'href="(\?cursor=[^"]+)">Older →', html)
    assert next_url
    html = client.get("/runs/" + next_url.group(1).replace("&amp;", "&")).content.decode()
    assert run_ids(html) == [runs[1].id, runs[0].id]
    assert "Older →" not in html and "← Newest" in html
    # A garbled cursor is the first page, not an error.
    assert run_ids(client.get("/runs/?cursor=%%%").content.decode()) == page1
    # So is one that decodes to a date that cannot be ("2026-13-40T00:00:00+00:00|run_x").
    impossible = "MjAyNi0xMy00MFQwMDowMDowMCswMDowMHxydW5feA"
    assert run_ids(client.get(f"/runs/?cursor={impossible}").content.decode()) == page1


def test_it_shows_status_epochs_attempts_timeline_and_checkpoints(
    client: Client, viewer: User
) -> None:
    run, cps = failed_run()
    client.force_login(viewer)
    html = client.get(f"/runs/{run.id}/").content.decode()
    assert f'id="run-{run.id}-status"' in html
    assert "Failed (needs new information)" in html
    assert f'id="run-{run.id}-attempts"' in html and f'id="run-{run.id}-timeline"' in html
    assert "<code><bdi>ValueError</bdi></code>" in html and "bad value 42" in html
    attempt = Attempt.objects.get(run=run)
    assert attempt.error_fingerprint in html
    assert "worker" not in attempt.worker_id or attempt.worker_id in html
    for cp in cps:
        assert cp.id in html
    assert "Attempt failed (deterministic): ValueError: bad value 42" in html
    assert html.count('class="event ') == RunEvent.objects.filter(run=run).count()


def test_it_filters_the_timeline(client: Client, viewer: User) -> None:
    run, _cps = failed_run()
    client.force_login(viewer)
    failures = client.get(f"/runs/{run.id}/timeline?events=failures", **HTMX).content.decode()
    types = re.findall(r'data-type="([a-z_.]+)"', failures)
    assert types == ["attempt.failed", "run.failed"]
    decisions = client.get(f"/runs/{run.id}/timeline?events=decisions", **HTMX).content.decode()
    assert re.findall(r'data-type="([a-z_.]+)"', decisions) == ["run.created"]
    # Without JavaScript the link goes to the page with the filter applied.
    page = client.get(f"/runs/{run.id}/?events=failures").content.decode()
    assert re.findall(r'data-type="([a-z_.]+)"', page) == ["attempt.failed", "run.failed"]


def test_it_cancels_a_running_run_with_a_reason(client: Client, operator: User) -> None:
    run = start()
    claim()
    client.force_login(operator)
    html = client.get(f"/runs/{run.id}/").content.decode()
    assert "Cancel run…" in html and "The running step stops at its next safe point." in html
    key = re.search(r'name="idempotency_key" value="([^"]+)"', html.split("run-cancel")[0] + html)
    assert key
    before = snapshot(run.id)
    response = client.post(
        f"/runs/{run.id}/cancel", {"idempotency_key": "c1", "run_id": run.id, "reason": ""}, **HTMX
    )
    assert response.status_code == 422
    assert "Say why the run is cancelled" in text(response)
    assert snapshot(run.id) == before
    response = client.post(
        f"/runs/{run.id}/cancel",
        {"idempotency_key": "c2", "run_id": run.id, "reason": "wrong input"},
        **HTMX,
    )
    assert response.status_code == 200
    body = text(response)
    assert "Cancel accepted. The running step stops at its next safe point." in body
    assert 'data-status="cancel_requested">Cancelling…</span>' in body
    assert f'<div id="run-{run.id}-main"' in body
    run.refresh_from_db()
    assert (run.status, run.cancel_reason, run.cancel_epoch) == (
        "cancel_requested",
        "wrong input",
        1,
    )
    # The cancel form is gone: asking twice is not offered.
    assert "Cancel this run" not in body


def test_it_cancels_a_waiting_run_at_once_without_javascript(
    client: Client, operator: User
) -> None:
    run, _lease, _cp, _req = interrupted()
    client.force_login(operator)
    response = client.post(
        f"/runs/{run.id}/cancel", {"idempotency_key": "c1", "run_id": run.id, "reason": "stop"}
    )
    assert response.status_code == 303 and response["Location"] == f"/runs/{run.id}/"
    page = client.get(response["Location"]).content.decode()
    assert "Run cancelled." in page
    assert "Closed: run cancelled" in page
    assert Run.objects.get(pk=run.id).status == "cancelled"
    # A stale cancel form names who cancelled and when.
    response = client.post(
        f"/runs/{run.id}/cancel",
        {"idempotency_key": "c2", "run_id": run.id, "reason": "again"},
        **HTMX,
    )
    assert response.status_code == 409
    assert "Already cancelled by olivia at" in text(response)


def test_it_retries_a_failed_run_from_an_earlier_checkpoint(client: Client, operator: User) -> None:
    run, (cp1, _cp2) = failed_run()
    client.force_login(operator)
    html = client.get(f"/runs/{run.id}/").content.decode()
    assert f'<option value="{cp1.id}">#1 · step1</option>' in html
    response = client.post(
        f"/runs/{run.id}/retry",
        {"idempotency_key": "r1", "run_id": run.id, "from_checkpoint": cp1.id, "reason": ""},
        **HTMX,
    )
    assert response.status_code == 422 and "Say why you retry" in text(response)
    response = client.post(
        f"/runs/{run.id}/retry",
        {
            "idempotency_key": "r2",
            "run_id": run.id,
            "from_checkpoint": cp1.id,
            "reason": "fixed the chart width",
        },
        **HTMX,
    )
    assert response.status_code == 200
    assert "Retry queued: attempt 2 continues from checkpoint #1." in text(response)
    attempt = Attempt.objects.get(run=run, number=2)
    assert (attempt.reason, attempt.resume_from_id) == ("retry", cp1.id)
    assert Attempt.objects.get(run=run, number=1).error_message == "bad value 42"
    # A second tab's retry form learns who retried.
    response = client.post(
        f"/runs/{run.id}/retry",
        {"idempotency_key": "r3", "run_id": run.id, "from_checkpoint": "", "reason": "again"},
        **HTMX,
    )
    assert response.status_code == 409
    assert "Already retried by olivia at" in text(response)
    assert Attempt.objects.filter(run=run).count() == 2


def test_it_disables_retry_with_the_reason_when_policy_forbids_it(
    client: Client, operator: User
) -> None:
    run, _cps = failed_run()

    def guard(r: Run) -> str | None:
        return "2 side effects are unknown; reconcile them first." if r.id == run.id else None

    register_retry_guard(guard)
    try:
        client.force_login(operator)
        html = text(client.get(f"/runs/{run.id}/"))
        assert "2 side effects are unknown; reconcile them first." in html
        assert re.search(
            r'<button type="button" class="btn btn-primary" disabled[^>]*>Retry…', html
        )
        response = client.post(
            f"/runs/{run.id}/retry",
            {"idempotency_key": "r1", "run_id": run.id, "reason": "try"},
            **HTMX,
        )
        assert response.status_code == 409
        assert "reconcile them first" in text(response)
        assert Attempt.objects.filter(run=run).count() == 1
    finally:
        _retry_guards.remove(guard)


def test_it_answers_in_place_on_the_run_page(client: Client, approver: User) -> None:
    run, _lease, _cp, req = ask(
        schema={"type": "object", "properties": {"ok": {"type": "boolean"}}}
    )
    client.force_login(approver)
    html = client.get(f"/runs/{run.id}/").content.decode()
    assert f'id="run-{run.id}-pending"' in html
    assert f'hx-target="#run-{run.id}-main"' in html
    response = client.post(
        f"/runs/{run.id}/requests/{req.id}/answer",
        {
            "idempotency_key": "a1",
            "run_id": run.id,
            "request_id": req.id,
            "checkpoint_id": req.checkpoint_id,
            "origin": "run",
            "answer/ok": "true",
        },
        **HTMX,
    )
    assert response.status_code == 200
    body = text(response)
    assert f'<div id="run-{run.id}-main"' in body
    assert "Answer sent. The run resumes in a new attempt." in body
    assert 'data-status="queued">Queued</span>' in body
    assert "Answered by alice at" in body
    assert 'hx-swap-oob="true"' in body  # the nav count follows


def test_it_shows_how_much_of_the_retry_budget_is_spent_and_that_a_retry_starts_anew(
    client: Client, operator: User
) -> None:
    """max_attempts counts failures in a row; a person's retry starts a new count (the run
    page says so, so attempt #9 under max_attempts=4 is no surprise)."""
    run = start()
    for _ in range(2):
        lease = claim()
        services.attempt_fail(**epochs(lease), error={"type": "Timeout", "message": "slow"})
    client.force_login(operator)
    page = text(client.get(f"/runs/{run.id}/"))
    assert "Automatic retries: 2 of 4 attempts failed in a row." in page
    assert "A person's retry starts a new count." in page
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})
    services.run_retry(run_id=run.id, reason="fixed it", user=operator)
    assert "Automatic retries: 0 of 4 attempts failed in a row." in text(
        client.get(f"/runs/{run.id}/")
    )


def test_a_running_runs_checkpoints_leave_its_cancel_and_pause_forms_alone(
    client: Client, operator: User
) -> None:
    """The live page keeps a part whose data-version did not change (with what a person
    typed in it): the controls of a running run keep theirs across its checkpoints, and
    change when the run fails (the retry form lists the checkpoints)."""
    run = start()
    lease = claim()
    client.force_login(operator)

    def controls_version() -> str:
        page = client.get(f"/runs/{run.id}/").content.decode()
        found = re.search(
            rf'id="run-{run.id}-controls" class="controls" data-version="(\w+)"', page
        )
        assert found, "no controls on the page"
        return found[1]

    services.checkpoint_save(**epochs(lease), step="one", state={})
    before = controls_version()
    services.checkpoint_save(**epochs(lease), step="two", state={})
    assert controls_version() == before
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})
    assert controls_version() != before
