"""Who may see and do what: login, 403 for a missing permission, 404 for outsiders, 405."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import InputRequest, Run
from tests.dashboard.support import HTMX, answer
from tests.runs.factory import interrupted, snapshot, start

pytestmark = pytest.mark.django_db

PAGES = ["/", "/?tab=all", "/?tab=answered", "/?tab=expired", "/runs/", "/inbox/count"]


def test_it_sends_anonymous_visitors_to_the_login_page(client: Client) -> None:
    run = start()
    for url in [*PAGES, f"/runs/{run.id}/", "/runs/new"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url
    response = client.post(f"/runs/{run.id}/cancel", {"reason": "x"})
    assert response.status_code == 302
    assert Run.objects.get(pk=run.id).status == "queued"


def test_it_logs_in_and_out(client: Client, viewer: User) -> None:
    page = client.get("/login/")
    assert page.status_code == 200
    response = client.post("/login/", {"username": "victor", "password": "pw-victor"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200
    wrong = Client().post("/login/", {"username": "victor", "password": "nope"})
    assert wrong.status_code == 200
    assert b"Please enter a correct username and password" in wrong.content
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_it_shows_an_outsider_a_403_on_lists_and_a_404_for_every_run(
    client: Client, outsider: User
) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(outsider)
    for url in PAGES:
        response = client.get(url)
        assert response.status_code == 403, url
        assert b"You have no access to runs yet." in response.content
    for url in [f"/runs/{run.id}/", f"/runs/{run.id}/timeline", "/runs/no-such-run/"]:
        assert client.get(url).status_code == 404, url
    before = snapshot(run.id)
    assert answer(client, req, [("answer/versions", "v1")]).status_code == 404
    for action in ("cancel", "retry"):
        response = client.post(f"/runs/{run.id}/{action}", {"reason": "x", "run_id": run.id})
        assert response.status_code == 404
    assert snapshot(run.id) == before


def test_it_lets_a_viewer_look_but_not_act(client: Client, viewer: User) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(viewer)
    assert client.get(f"/runs/{run.id}/").status_code == 200
    assert client.get("/runs/new").status_code == 403
    before = snapshot(run.id)
    response = answer(client, req, [("answer/versions", "v1")])
    assert response.status_code == 403
    key = {"idempotency_key": "k1", "run_id": run.id, "reason": "x"}
    assert client.post(f"/runs/{run.id}/cancel", key).status_code == 403
    assert client.post(f"/runs/{run.id}/retry", key).status_code == 403
    assert snapshot(run.id) == before


def test_it_shows_a_viewer_disabled_buttons_that_say_who_can_act(
    client: Client, viewer: User
) -> None:
    run, *_ = interrupted(kind="auth_required")
    client.force_login(viewer)
    html = client.get(f"/runs/{run.id}/").content.decode()
    assert "Only approvers can approve or deny this." in html
    # config_store: the server knows a version can be restored, so not the red button.
    assert 'value="approve" class="btn btn-primary" disabled' in html
    assert "Only operators can cancel runs." in html


def test_it_separates_answering_from_approving(client: Client, operator: User) -> None:
    """An operator may answer questions but not approve risky actions."""
    _run, _lease, _cp, req = interrupted(kind="auth_required")
    client.force_login(operator)
    assert client.get("/").content.decode().count("request-card") == 0
    response = answer(client, req, {"decision": "approve"})
    assert response.status_code == 403
    assert InputRequest.objects.get(pk=req.id).status == "pending"


def test_it_refuses_get_on_every_action(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(operator)
    for url in [
        f"/runs/{run.id}/cancel",
        f"/runs/{run.id}/retry",
        f"/runs/{run.id}/requests/{req.id}/answer",
    ]:
        assert client.get(url).status_code == 405, url
    assert client.put("/runs/new").status_code == 405
    assert client.post("/runs/", {}).status_code == 405
    assert client.post("/", {}).status_code == 405


def test_it_404s_a_request_addressed_under_another_run(client: Client, operator: User) -> None:
    _run, _lease, _cp, req = interrupted()
    other = start()
    client.force_login(operator)
    response = client.post(
        f"/runs/{other.id}/requests/{req.id}/answer",
        {"idempotency_key": "k", "request_id": req.id, "checkpoint_id": req.checkpoint_id},
    )
    assert response.status_code == 404


def test_it_requires_csrf_on_every_action(operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    before = snapshot(run.id)
    response = answer(client, req, [("answer/versions", "v1")])
    assert response.status_code == 403
    assert b"This form has expired" in response.content
    response = client.post(
        f"/runs/{run.id}/cancel", {"idempotency_key": "k", "run_id": run.id, "reason": "x"}, **HTMX
    )
    assert response.status_code == 403
    assert snapshot(run.id) == before


def test_it_sends_security_headers(client: Client, viewer: User) -> None:
    client.force_login(viewer)
    response = client.get("/")
    csp = response["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in csp.split(";"))
    assert directives["script-src"] == "'self'"
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert directives["frame-ancestors"] == "'none'"
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    html = response.content.decode()
    # No inline scripts at all: every <script> has a src.
    assert "<script>" not in html and "<script " in html
    assert all("src=" in tag for tag in html.split("<script ")[1:])
    assert " style=" not in html


def test_it_sends_an_expired_htmx_session_to_the_login_page(client: Client) -> None:
    run, _lease, _cp, req = interrupted()
    response = answer(client, req, [("answer/versions", "v1")], htmx=True)
    # Not a 302 that htmx would follow and swap into the card: a full-page redirect.
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/login/?next=/"
    response = client.get(
        f"/runs/{run.id}/timeline", HTTP_HX_CURRENT_URL=f"http://testserver/runs/{run.id}/", **HTMX
    )
    assert response["HX-Redirect"] == f"/login/?next=/runs/{run.id}/"
    assert InputRequest.objects.get(pk=req.id).status == "pending"


def test_it_shows_the_admin_link_to_staff_only(client: Client, operator: User) -> None:
    client.force_login(operator)
    assert 'href="/admin/"' not in client.get("/").content.decode()
    operator.is_staff = True
    operator.save()
    assert 'href="/admin/"' in client.get("/").content.decode()
