"""Company sign-in against a real OpenID provider (tests/oidc_provider, django-oauth-toolkit
in its own process): the authorization-code flow over HTTP between the provider and
Holdpoint's live server, as a browser walks it.

Each refusal is checked for what it must not do as well: nobody signed in, no account or
identity made, no group changed.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest
import requests
import time_machine
from django.contrib.auth import authenticate
from django.contrib.auth.models import Group, User
from django.test import Client

from runs.models import OidcIdentity
from runs.oidc import BACKEND
from tests.oidc.conftest import Browser, Provider

pytestmark = [pytest.mark.process]


def groups_of(user: User) -> set[str]:
    return set(User.objects.get(pk=user.pk).groups.values_list("name", flat=True))


def signed_in(browser: Browser) -> bool:
    """Whether the browser's Holdpoint session is signed in (the inbox answers, not the
    sign-in page)."""
    response = browser.get("/profile/")
    return response.status_code == 200


def with_state(callback: str, state: str) -> str:
    parts = urlsplit(callback)
    query = parse_qs(parts.query)
    query["state"] = [state]
    return urlunsplit(parts._replace(query=urlencode(query, doseq=True)))


# --- Signing in ---------------------------------------------------------------------------------


def test_it_signs_in_a_new_person_with_the_groups_their_claims_map_to(
    oidc: Provider, browser_factory: Any
) -> None:
    sub = oidc.user("pat", groups=["hp-approvers", "finance", "not-mapped", "x" * 300])
    browser = browser_factory()

    login_page = browser.get("/login/")
    assert "Sign in with Acme SSO" in login_page.text
    final = browser.sign_in("pat")

    assert final.status_code == 200 and urlsplit(final.url).path == "/", final.url
    identity = OidcIdentity.objects.select_related("user").get(issuer=oidc.issuer, subject=sub)
    user = identity.user
    assert user.username == "pat" and user.email == "pat@example.com"
    assert not user.has_usable_password()
    assert groups_of(user) == {"approver", "finance-approvers"}
    assert Group.objects.get(name="finance-approvers").permissions.count() == 0
    assert identity.last_sign_in_at is not None
    assert signed_in(browser)


def test_it_recomputes_the_managed_groups_at_each_sign_in_and_leaves_the_others(
    oidc: Provider, browser_factory: Any
) -> None:
    oidc.user("quinn", groups=["hp-approvers"])
    browser_factory().sign_in("quinn")
    user = User.objects.get(oidc_identity__issuer=oidc.issuer)
    # An admin gives a group the mapping does not manage, and one it does, by hand.
    auditors = Group.objects.create(name="auditors")
    user.groups.add(auditors, Group.objects.get(name="operator"))

    oidc.user("quinn", groups=["hp-viewers"])
    final = browser_factory().sign_in("quinn")

    assert final.status_code == 200
    # operator is managed (hp-operators maps to it) and the claims do not give it: gone.
    assert groups_of(user) == {"viewer", "auditors"}
    assert OidcIdentity.objects.get(user=user).mapped_groups == ["viewer"]


def test_it_finds_people_by_subject_not_by_email(oidc: Provider, browser_factory: Any) -> None:
    oidc.user("rene", email="rene@example.com", groups=["hp-viewers"])
    browser_factory().sign_in("rene")
    first = User.objects.get(oidc_identity__issuer=oidc.issuer)

    oidc.user("rene", email="rene.new@example.com", groups=["hp-viewers"])
    browser_factory().sign_in("rene")

    assert User.objects.filter(oidc_identity__isnull=False).count() == 1
    assert User.objects.get(pk=first.pk).email == "rene.new@example.com"


# --- Removing a group ---------------------------------------------------------------------------


def test_it_takes_a_removed_group_away_at_the_next_request_after_the_refresh(
    oidc: Provider, browser_factory: Any, settings: Any
) -> None:
    settings.HOLDPOINT_OIDC_REFRESH_SECONDS = 600
    oidc.user("sam", groups=["hp-viewers"])
    browser = browser_factory()
    browser.sign_in("sam")
    assert browser.get("/runs/").status_code == 200

    oidc.user("sam", groups=[])  # the directory takes sam out of the group
    # Until the session is due for confirmation, the claims of the last sign-in hold
    # (docs/security.md: at most HOLDPOINT_OIDC_REFRESH_SECONDS).
    assert browser.get("/runs/").status_code == 200

    with time_machine.travel(time.time() + 601, tick=True):
        # Due: nothing but a page load goes through on the old claims.
        csrf = str(browser.session.cookies.get("csrftoken"))
        post = browser.post("/profile/", {"email": "on", "csrfmiddlewaretoken": csrf})
        assert post.status_code == 401
        htmx = browser.get("/runs/", headers={"HX-Request": "true"})
        assert htmx.status_code == 401 and htmx.headers["HX-Refresh"] == "true"
        api = browser.get("/api/runs")
        assert api.status_code == 401
        assert api.headers["Content-Type"].startswith("application/problem+json")
        user = User.objects.get(oidc_identity__issuer=oidc.issuer)
        assert groups_of(user) == {"viewer"}  # nothing recomputed yet

        page = browser.get("/runs/")
        assert page.status_code == 302
        authorize = page.headers["Location"]
        assert authorize.startswith(oidc.issuer) and "prompt=none" in authorize
        final = browser.follow(page)

    assert final.url.endswith("/runs/")
    assert final.status_code == 403  # the right is gone
    assert groups_of(user) == set()


# --- Refused callbacks --------------------------------------------------------------------------


def test_it_refuses_a_replayed_callback(oidc: Provider, browser_factory: Any) -> None:
    oidc.user("tess", groups=["hp-viewers"])
    browser = browser_factory()
    callback = browser.to_callback("tess")
    assert browser.follow(browser.get(callback)).status_code == 200
    stranger = browser_factory()

    again = browser.get(callback)
    theirs = stranger.get(callback)

    assert again.status_code == 400
    assert "was used before" in again.text
    assert not signed_in(browser)  # a failed callback signs the session out
    assert theirs.status_code == 403
    assert not signed_in(stranger)


def test_it_refuses_a_tampered_state(oidc: Provider, browser_factory: Any) -> None:
    oidc.user("uma", groups=["hp-viewers"])
    browser = browser_factory()
    callback = browser.to_callback("uma")

    refused = browser.get(with_state(callback, "forged-state"))

    assert refused.status_code == 400
    assert not signed_in(browser)
    assert not OidcIdentity.objects.exists()
    # The real answer still works: the forged one consumed nothing.
    assert browser.follow(browser.get(callback)).status_code == 200


def _two_sign_ins(browser: Browser, username: str) -> tuple[str, str]:
    first = browser.to_callback(username)
    second = browser.to_callback(username)
    state_of_second = parse_qs(urlsplit(second).query)["state"][0]
    # The code of the first sign-in, sent back with the second one's state: what an attacker
    # who stole a code would try in their own session.
    return with_state(first, state_of_second), second


def test_it_refuses_a_code_from_another_sign_in_through_pkce(
    oidc: Provider, browser_factory: Any
) -> None:
    oidc.user("vic", groups=["hp-viewers"])
    browser = browser_factory()
    swapped, _ = _two_sign_ins(browser, "vic")

    refused = browser.get(swapped)

    # The provider refuses the code: the verifier of the second sign-in is not the first's.
    assert refused.status_code == 502
    assert not signed_in(browser)
    assert not OidcIdentity.objects.exists()


def test_it_refuses_an_id_token_with_another_sign_ins_nonce(
    oidc: Provider, browser_factory: Any, settings: Any
) -> None:
    # Without PKCE the provider exchanges the code; the nonce is what is left to refuse it.
    settings.OIDC_USE_PKCE = False
    oidc.user("wes", groups=["hp-viewers"])
    browser = browser_factory()
    swapped, _ = _two_sign_ins(browser, "wes")

    refused = browser.get(swapped)

    assert refused.status_code == 400
    assert "does not check out" in refused.text
    assert not signed_in(browser)
    assert not OidcIdentity.objects.exists()


def test_it_refuses_a_token_from_another_issuer(
    oidc: Provider, other_provider: Provider, browser_factory: Any, settings: Any
) -> None:
    other_provider.user("xan", groups=["hp-viewers"])
    # Every endpoint at the second provider, whose tokens say its own issuer; the setting
    # still names the first.
    settings.HOLDPOINT_OIDC_AUTHORIZATION_ENDPOINT = f"{other_provider.issuer}/authorize/"
    settings.HOLDPOINT_OIDC_TOKEN_ENDPOINT = f"{other_provider.issuer}/token/"
    settings.HOLDPOINT_OIDC_USERINFO_ENDPOINT = f"{other_provider.issuer}/userinfo/"
    settings.HOLDPOINT_OIDC_JWKS_URI = f"{other_provider.issuer}/.well-known/jwks.json"
    browser = browser_factory()

    refused = browser.follow(browser.get(browser.to_callback("xan")))

    assert refused.status_code == 400
    assert not signed_in(browser)
    assert not OidcIdentity.objects.exists()
    # The same flow with the second provider named as the issuer signs in: the issuer, and
    # nothing else, was the reason.
    settings.HOLDPOINT_OIDC_ISSUER = other_provider.issuer
    assert browser.sign_in("xan").status_code == 200
    assert OidcIdentity.objects.get().issuer == other_provider.issuer


# --- Existing accounts --------------------------------------------------------------------------


def test_it_never_takes_over_an_account_with_the_same_email_by_default(
    oidc: Provider, browser_factory: Any
) -> None:
    local = User.objects.create_user("yara", email="yara@example.com", password="local-pw")
    oidc.user("yara-sso", email="yara@example.com", groups=["hp-approvers"])
    browser = browser_factory()

    refused = browser.follow(browser.get(browser.to_callback("yara-sso")))

    assert refused.status_code == 403
    assert "already exists" in refused.text
    assert not OidcIdentity.objects.exists()
    assert groups_of(local) == set()
    assert not signed_in(browser)


def test_it_links_a_verified_email_only_when_the_setting_allows(
    oidc: Provider, browser_factory: Any, settings: Any
) -> None:
    settings.HOLDPOINT_OIDC_LINK_BY_EMAIL = True
    local = User.objects.create_user("zed", email="zed@example.com", password="local-pw")
    User.objects.create_user("root", email="root@example.com", password="x", is_staff=True)
    oidc.user("zed-sso", email="zed@example.com", email_verified=False)
    oidc.user("root-sso", email="root@example.com", email_verified=True)

    refused = browser_factory()
    assert refused.follow(refused.get(refused.to_callback("zed-sso"))).status_code == 403
    staff = browser_factory()
    assert staff.follow(staff.get(staff.to_callback("root-sso"))).status_code == 403
    assert not OidcIdentity.objects.exists()

    oidc.user("zed-sso", email="zed@example.com", email_verified=True, groups=["hp-viewers"])
    linked = browser_factory()
    assert linked.sign_in("zed-sso").status_code == 200
    assert OidcIdentity.objects.get().user == local
    assert groups_of(local) == {"viewer"}


# --- Passwords off ------------------------------------------------------------------------------


def test_it_refuses_every_password_sign_in_when_passwords_are_off(
    oidc: Provider, browser_factory: Any, settings: Any
) -> None:
    User.objects.create_user("ada", password="right-password")
    User.objects.create_superuser("boss", password="right-password")
    client = Client()
    # With passwords on, the same requests sign in: the refusals below are the setting's.
    assert (
        client.post("/login/", {"username": "ada", "password": "right-password"}).status_code == 302
    )
    client.logout()

    settings.HOLDPOINT_PASSWORD_LOGIN = False
    settings.AUTHENTICATION_BACKENDS = [BACKEND]

    page = client.get("/login/")
    assert 'name="password"' not in page.content.decode()
    assert "Sign in with Acme SSO" in page.content.decode()
    refused = client.post("/login/", {"username": "ada", "password": "right-password"})
    assert refused.status_code == 403
    assert "Password sign-in is turned off" in refused.content.decode()
    admin = client.post("/admin/login/", {"username": "boss", "password": "right-password"})
    assert admin.status_code == 403
    assert client.get("/admin/login/?next=/admin/").headers["Location"].startswith("/login/")
    assert client.get("/profile/").status_code == 302  # nobody signed in
    assert authenticate(username="boss", password="right-password") is None

    # The provider still signs people in.
    oidc.user("ada-sso", groups=["hp-viewers"])
    assert browser_factory().sign_in("ada-sso").status_code == 200


# --- Throttles and the switch -------------------------------------------------------------------


def test_it_throttles_sign_ins_and_failed_callbacks_per_address(
    oidc: Provider, settings: Any
) -> None:
    settings.HOLDPOINT_THROTTLE_ANON = "3/min"
    client = Client()
    answers = [client.get("/oidc/authenticate/").status_code for _ in range(4)]
    assert answers == [302, 302, 302, 429]

    settings.HOLDPOINT_THROTTLE_ANON = "600/min"
    settings.HOLDPOINT_THROTTLE_AUTH_FAILURES = "1/min"
    first = Client().get("/oidc/callback/?code=x&state=y")
    second = Client().get("/oidc/callback/?code=x&state=y")
    assert first.status_code == 403
    assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1


def test_its_endpoints_take_only_get(oidc: Provider) -> None:
    client = Client()  # without the CSRF check, which would answer 403 first
    assert client.post("/oidc/authenticate/").status_code == 405
    assert client.post("/oidc/callback/?code=x&state=y").status_code == 405
    assert not OidcIdentity.objects.exists()


def test_a_password_form_never_makes_the_backend_redeem_a_code(
    oidc: Provider, settings: Any
) -> None:
    settings.HOLDPOINT_OIDC_TOKEN_ENDPOINT = "http://127.0.0.1:9/never-called"
    User.objects.create_user("eve", password="right-password")

    wrong = Client().post("/login/?code=x&state=y", {"username": "eve", "password": "nope"})
    right = Client().post(
        "/login/?code=x&state=y", {"username": "eve", "password": "right-password"}
    )

    assert wrong.status_code == 200  # the form again, not the provider's error
    assert right.status_code == 302
    assert not OidcIdentity.objects.exists()


def test_it_is_all_gone_when_no_provider_is_configured(db: None) -> None:
    client = Client()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    page = client.get("/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page


def test_the_provider_names_our_client(oidc: Provider) -> None:
    # Guards the fixture itself: the flow above runs against this provider, not a stand-in.
    document = requests.get(f"{oidc.issuer}/.well-known/openid-configuration", timeout=60).json()
    assert document["issuer"] == oidc.issuer
    assert "RS256" in document["id_token_signing_alg_values_supported"]


def test_it_signs_out_a_person_the_provider_no_longer_signs_in(
    oidc: Provider, browser_factory: Any, settings: Any
) -> None:
    settings.HOLDPOINT_OIDC_REFRESH_SECONDS = 600
    oidc.user("yan", groups=["hp-viewers"])
    browser = browser_factory()
    browser.sign_in("yan")
    oidc.user("yan", groups=["hp-viewers"], password="changed")  # ends yan's session there

    with time_machine.travel(time.time() + 601, tick=True):
        final = browser.follow(browser.get("/runs/"))

    # The provider answers the silent confirmation with login_required: signed out here.
    assert urlsplit(final.url).path == "/oidc/callback/"
    assert final.status_code == 403
    assert "did not sign you in" in final.text
    assert not signed_in(browser)


def test_a_decision_made_in_an_oidc_session_says_so_in_the_audit_trail(
    oidc: Provider, browser_factory: Any
) -> None:
    """The audit trail's identity of a dashboard decision is the session's sign-in: the
    company's provider here (``session:oidc``), a password elsewhere (``session:password``)."""
    from runs.models import RunEvent
    from tests.runs.factory import start

    oidc.user("olga", groups=["hp-operators"])
    browser = browser_factory()
    browser.sign_in("olga")
    run = start()
    browser.get(f"/runs/{run.id}/")
    csrf = str(browser.session.cookies.get("csrftoken"))
    cancel = browser.post(
        f"/runs/{run.id}/cancel",
        {
            "csrfmiddlewaretoken": csrf,
            "idempotency_key": "oidc-cancel-1",
            "run_id": run.id,
            "reason": "signed in at the provider",
        },
    )
    assert cancel.status_code in (302, 303), cancel.text[:300]
    event = RunEvent.objects.get(run_id=run.id, type="run.cancel_requested")
    assert (event.actor, event.payload["via"], event.payload["identity"]) == (
        "user:olga",
        "dashboard",
        "session:oidc",
    )
