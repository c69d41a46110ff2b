"""Issue 13, finding 12: ``/metrics`` is not open to anyone in production, and
``check --deploy`` says so when its token is missing."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from django.test import Client, override_settings

from tests.ops.test_settings import PRODUCTION, manage

pytestmark = pytest.mark.django_db

WITHOUT_TOKEN = {k: v for k, v in PRODUCTION.items() if k != "HOLDPOINT_METRICS_TOKEN"}


@override_settings(HOLDPOINT_METRICS_TOKEN="", HOLDPOINT_METRICS_PUBLIC=False)
def test_metrics_without_a_token_are_refused_when_not_public(client: Client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 403
    assert b"holdpoint_runs" not in response.content
    assert b"HOLDPOINT_METRICS_TOKEN" in response.content


@override_settings(HOLDPOINT_METRICS_TOKEN="", HOLDPOINT_METRICS_PUBLIC=True)
def test_metrics_can_be_made_public_explicitly(client: Client) -> None:
    assert client.get("/metrics").status_code == 200


@override_settings(HOLDPOINT_METRICS_TOKEN="t0ken", HOLDPOINT_METRICS_PUBLIC=False)
def test_metrics_with_a_token_need_it(client: Client) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer t0ken").status_code == 200


def test_production_keeps_metrics_private_by_default(tmp_path: Path) -> None:
    result = manage(
        "shell",
        "-c",
        "from django.conf import settings; print(settings.HOLDPOINT_METRICS_PUBLIC)",
        HOLDPOINT_VAR_DIR=str(tmp_path),
        **WITHOUT_TOKEN,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "False"


@pytest.mark.parametrize(
    ("extra", "warning"),
    [({}, "holdpoint.W002"), ({"HOLDPOINT_METRICS_PUBLIC": "true"}, "holdpoint.W001")],
)
def test_check_deploy_warns_without_a_metrics_token(
    tmp_path: Path, extra: dict[str, str], warning: str
) -> None:
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        HOLDPOINT_VAR_DIR=str(tmp_path),
        **WITHOUT_TOKEN,
        **extra,
    )
    assert result.returncode != 0
    assert warning in result.stdout + result.stderr
    with_token = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        HOLDPOINT_VAR_DIR=str(tmp_path),
        **WITHOUT_TOKEN,
        **extra,
        HOLDPOINT_METRICS_TOKEN=secrets.token_urlsafe(32),
    )
    assert with_token.returncode == 0, with_token.stdout + with_token.stderr
