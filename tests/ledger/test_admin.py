"""The admin shows side effects and changes none of them: writes go through the services."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger import services as ledger
from ledger.models import SideEffect
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db


def test_the_admin_lists_and_shows_side_effects_read_only(config_dir: Path) -> None:
    start()
    effect = ledger.side_effect_perform(
        **epochs(claim()),
        step_id="rotate",
        tool="config_store",
        target="staging/auth/config",
        request={"document": "staging/auth/config", "content": {}},
    ).side_effect
    admin = User.objects.create_superuser("root", "root@example.com", "pw-root")
    client = Client()
    client.force_login(admin)
    listing = client.get("/admin/ledger/sideeffect/?status=confirmed")
    assert listing.status_code == 200
    assert effect.operation_id in listing.content.decode()
    page = client.get(f"/admin/ledger/sideeffect/{effect.operation_id}/change/")
    assert page.status_code == 200
    assert "staging/auth/config@v1" in page.content.decode()
    assert client.get("/admin/ledger/sideeffect/add/").status_code == 403
    deleted = client.post(
        f"/admin/ledger/sideeffect/{effect.operation_id}/delete/", {"post": "yes"}
    )
    assert deleted.status_code == 403
    assert SideEffect.objects.filter(pk=effect.pk).exists()
