"""Claims are untrusted input (runs/oidc.py ``parse_claims``), and the settings that map them
stop start-up when they cannot be read (config/env.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_group_map, env_oidc_issuer
from runs.oidc import MAX_GROUP_VALUES, SignInRefused, parse_claims

ISSUER = "https://login.example.com/realms/staff"


@pytest.fixture(autouse=True)
def _mapping(settings: Any) -> None:
    settings.HOLDPOINT_OIDC_GROUPS_CLAIM = "groups"
    settings.HOLDPOINT_OIDC_GROUP_MAP = {"hp-approvers": ["approver"], "fin": ["finance"]}


@pytest.mark.parametrize("sub", [None, "", 7, "x" * 256, "a\x00b", "line\nbreak"])
def test_it_refuses_a_sign_in_without_a_usable_subject(sub: Any) -> None:
    with pytest.raises(SignInRefused):
        parse_claims(issuer=ISSUER, claims={"sub": sub})


def test_it_keeps_only_mapped_groups_and_drops_odd_values() -> None:
    claims = parse_claims(
        issuer=ISSUER,
        claims={
            "sub": "248289761001",
            "email": "pat@example.com\x00",
            "email_verified": "yes",
            "preferred_username": "p" * 10_000,
            "groups": ["hp-approvers", "hp-approvers" + "x" * 300, 42, {"a": 1}, "admins"],
        },
    )

    assert claims.groups == frozenset({"approver"})
    assert claims.ignored_groups == 4
    assert claims.email == ""  # a control character: no e-mail at all
    assert claims.email_verified is False  # only true (or "true") counts
    assert len(claims.username) == 150


def test_it_reads_a_single_group_as_a_string_and_caps_the_list() -> None:
    one = parse_claims(issuer=ISSUER, claims={"sub": "s", "groups": "fin"})
    many = parse_claims(
        issuer=ISSUER, claims={"sub": "s", "groups": ["noise"] * (MAX_GROUP_VALUES + 10) + ["fin"]}
    )
    not_a_list = parse_claims(issuer=ISSUER, claims={"sub": "s", "groups": {"fin": True}})

    assert one.groups == frozenset({"finance"})
    assert many.groups == frozenset()  # values past the cap are not read
    assert not_a_list.groups == frozenset()


def test_it_reads_the_group_map_as_pairs_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAP", "hp-ops=operator, hp-ops=finance ,cn=x=approver")
    assert env_group_map("MAP") == {"hp-ops": ["operator", "finance"], "cn=x": ["approver"]}
    monkeypatch.setenv("MAP", '{"cn=Fin,ou=g": ["approver", "finance"], "v": "viewer"}')
    assert env_group_map("MAP") == {"cn=Fin,ou=g": ["approver", "finance"], "v": ["viewer"]}
    for bad in ("hp-ops", "hp-ops=", '{"a": 1}', "{not json", "[1]"):
        monkeypatch.setenv("MAP", bad)
        with pytest.raises(ImproperlyConfigured, match="MAP"):
            env_group_map("MAP")


def test_it_takes_an_https_issuer_or_a_loopback_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for good in (ISSUER, "https://tenant.example.com/", "http://127.0.0.1:9000/o"):
        monkeypatch.setenv("ISS", good)
        assert env_oidc_issuer("ISS") == good  # kept exactly, trailing slash and all
    for bad in ("http://login.example.com", "login.example.com", "https://x.example?a=1"):
        monkeypatch.setenv("ISS", bad)
        with pytest.raises(ImproperlyConfigured, match="ISS"):
            env_oidc_issuer("ISS")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HOLDPOINT_PASSWORD_LOGIN": "0"}, "nobody could sign in"),
        ({"HOLDPOINT_OIDC_ISSUER": ISSUER}, "HOLDPOINT_OIDC_CLIENT_ID"),
        (
            {
                "HOLDPOINT_OIDC_ISSUER": ISSUER,
                "HOLDPOINT_OIDC_CLIENT_ID": "c",
                "HOLDPOINT_OIDC_CLIENT_SECRET": "s",
                "HOLDPOINT_OIDC_SCOPES": "email",
            },
            "must include openid",
        ),
    ],
)
def test_a_sign_in_that_cannot_work_stops_start_up(
    tmp_path: Any, env: dict[str, str], message: str
) -> None:
    from tests.ops.test_settings import manage

    result = manage("check", HOLDPOINT_VAR_DIR=str(tmp_path), **env)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr
