"""The ledger's pages: what needs reconciliation, the run's report, reconcile and compensate."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger import services as ledger
from ledger.models import SideEffect
from runs import services
from runs.models import Run, RunEvent
from tests.dashboard.support import HTMX, text
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def config_dir(settings: Any, tmp_path: Path) -> Path:
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    return settings.HOLDPOINT_CONFIG_STORE_DIR


def webhook(
    lease: Any, step: str, *, status: str, reference: str = "", target: str = "deploy-hook"
) -> SideEffect:
    begun = ledger.side_effect_begin(
        **epochs(lease),
        step_id=step,
        tool="webhook",
        target=target,
        request={"url": "http://127.0.0.1:9/hook", "body": {"v": 1}},
    )
    error = {"type": "OutcomeUnknown", "message": "timed out"} if status == "unknown" else None
    return ledger.side_effect_record_outcome(
        operation_id=begun.operation_id, status=status, external_reference=reference, error=error
    )


def a_run_with_effects(config_dir: Path) -> tuple[Run, dict[str, SideEffect]]:
    """One run with an effect in each group of the report, failed on the unknown one."""
    run = start(approvals=["notify", "announce", "refused"])
    lease = claim()
    effects = {
        "happened": ledger.side_effect_perform(
            **epochs(lease),
            step_id="rotate",
            tool="config_store",
            target="staging/auth/config",
            request={"document": "staging/auth/config", "content": {"ttl": 60}},
        ).side_effect,
        "cannot_be_undone": webhook(lease, "announce", status="confirmed", reference="dlv_7"),
        "did_not_happen": webhook(lease, "refused", status="failed"),
        "unknown": webhook(lease, "notify", status="unknown"),
    }
    services.attempt_fail(
        **epochs(lease),
        error={"class": "side_effect_unknown", "type": "SideEffectUnknown", "message": "notify"},
    )
    run.refresh_from_db()
    return run, effects


def reconcile(client: Client, effect: SideEffect, key: str = "r-1", **data: Any) -> Any:
    htmx = data.pop("htmx", False)
    payload = {"idempotency_key": key, "operation_id": effect.operation_id, **data}
    return client.post(
        f"/side-effects/{effect.operation_id}/reconcile", payload, **(HTMX if htmx else {})
    )


def test_it_lists_what_needs_reconciliation(
    client: Client, operator: User, config_dir: Path
) -> None:
    _run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    html = text(client.get("/side-effects/"))
    assert f'id="effect-{effects["unknown"].operation_id}"' in html
    assert f'id="effect-{effects["happened"].operation_id}"' not in html
    assert "Unknown — needs reconciliation" in html
    assert "Mark happened" in html and "Mark not happened" in html
    assert effects["unknown"].idempotency_key in html
    assert '<span id="effects-needs-count" class="tab-count">1</span>' in html
    everything = text(client.get("/side-effects/?tab=all"))
    for effect in effects.values():
        assert f'id="effect-{effect.operation_id}"' in everything


def test_it_shows_a_viewer_disabled_actions(client: Client, viewer: User, config_dir: Path) -> None:
    _run, effects = a_run_with_effects(config_dir)
    client.force_login(viewer)
    html = text(client.get("/side-effects/"))
    assert "Only operators can reconcile or compensate side effects." in html
    response = reconcile(client, effects["unknown"], outcome="confirmed", note="checked")
    assert response.status_code == 403
    assert SideEffect.objects.get(pk=effects["unknown"].pk).status == "unknown"


def test_it_hides_everything_from_an_outsider(
    client: Client, outsider: User, config_dir: Path
) -> None:
    run, effects = a_run_with_effects(config_dir)
    client.force_login(outsider)
    assert client.get("/side-effects/").status_code == 403
    assert client.get(f"/side-effects/runs/{run.id}/").status_code == 404
    assert client.get(f"/side-effects/runs/{run.id}/retry-preview").status_code == 404
    response = reconcile(client, effects["unknown"], outcome="confirmed", note="x")
    assert response.status_code == 404
    compensate = client.post(
        f"/side-effects/{effects['happened'].operation_id}/compensate",
        {"idempotency_key": "c", "operation_id": effects["happened"].operation_id},
    )
    assert compensate.status_code == 404


def test_it_refuses_get_on_the_actions(client: Client, operator: User, config_dir: Path) -> None:
    _run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    op = effects["unknown"].operation_id
    assert client.get(f"/side-effects/{op}/reconcile").status_code == 405
    assert client.get(f"/side-effects/{op}/compensate").status_code == 405


def test_it_needs_a_note_and_records_nothing_without_one(
    client: Client, operator: User, config_dir: Path
) -> None:
    _run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    for htmx in (True, False):
        response = reconcile(client, effects["unknown"], outcome="confirmed", note="", htmx=htmx)
        assert response.status_code == 422
        assert "Say what you checked and how" in text(response)
    assert SideEffect.objects.get(pk=effects["unknown"].pk).status == "unknown"


def test_it_marks_an_unknown_effect_happened_once_per_key(
    client: Client, operator: User, config_dir: Path
) -> None:
    run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    assert "must be reconciled first" in text(client.get(f"/runs/{run.id}/"))
    data = {"outcome": "confirmed", "external_reference": "dlv_42", "note": "Seen in the log"}
    first = reconcile(client, effects["unknown"], htmx=True, **data)
    again = reconcile(client, effects["unknown"], htmx=True, **data)
    for response in (first, again):
        assert response.status_code == 200
        assert "Marked as happened." in text(response)
    effect = SideEffect.objects.get(pk=effects["unknown"].pk)
    assert (effect.status, effect.external_reference, effect.resolution_note) == (
        "confirmed",
        "dlv_42",
        "Seen in the log",
    )
    assert RunEvent.objects.filter(run=run, type="side_effect.reconciled").count() == 1
    body = text(first)
    assert "Reconciled" in body and "Seen in the log" in body and "user:olivia" in body
    # A second person's stale form learns who settled it.
    stale = reconcile(
        client, effects["unknown"], key="r-2", htmx=True, outcome="not_applied", note="x"
    )
    assert stale.status_code == 409
    assert "Already reconciled as confirmed by user:olivia" in text(stale)
    # The run may be retried now.
    assert "must be reconciled first" not in text(client.get(f"/runs/{run.id}/"))


def test_it_marks_not_happened_without_javascript(
    client: Client, operator: User, config_dir: Path
) -> None:
    _run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    response = reconcile(client, effects["unknown"], outcome="not_applied", note="No delivery")
    assert response.status_code == 303 and response["Location"] == "/side-effects/"
    page = text(client.get("/side-effects/"))
    assert "Marked as not happened." in page
    assert SideEffect.objects.get(pk=effects["unknown"].pk).status == "failed"


def test_it_compensates_what_can_be_undone_and_only_that(
    client: Client, operator: User, config_dir: Path
) -> None:
    run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    report = text(client.get(f"/side-effects/runs/{run.id}/"))
    happened = effects["happened"].operation_id
    irreversible = effects["cannot_be_undone"].operation_id
    assert f"/side-effects/{happened}/compensate" in report
    assert f"/side-effects/{irreversible}/compensate" not in report
    data = {"idempotency_key": "c-1", "operation_id": happened, "origin": "report"}
    refused = client.post(f"/side-effects/{happened}/compensate", data, **HTMX)
    assert refused.status_code == 422 and "Say why you undo it" in text(refused)
    assert SideEffect.objects.get(pk=happened).status == "confirmed"
    data["reason"] = "the rotation broke logins"
    first = client.post(f"/side-effects/{happened}/compensate", data, **HTMX)
    again = client.post(f"/side-effects/{happened}/compensate", data, **HTMX)
    assert first.status_code == again.status_code == 200
    assert "Undone: the compensating action ran." in text(first)
    assert "Undone: the compensating action ran." in text(again)
    assert "the rotation broke logins" in text(first)
    assert SideEffect.objects.get(pk=happened).status == "compensated"
    assert RunEvent.objects.filter(run=run, type="side_effect.compensated").count() == 1
    refused = client.post(
        f"/side-effects/{irreversible}/compensate",
        {"idempotency_key": "c-2", "operation_id": irreversible, "reason": "r"},
        **HTMX,
    )
    assert refused.status_code == 409
    assert "cannot be undone" in text(refused)


def test_the_report_has_five_groups_in_order_with_counts(
    client: Client, viewer: User, config_dir: Path
) -> None:
    run, effects = a_run_with_effects(config_dir)
    client.force_login(viewer)
    html = text(client.get(f"/side-effects/runs/{run.id}/"))
    titles = re.findall(
        r'<h3 class="group-title" id="group-(\w+)-title">([^<]+) <span class="count">(\d+)', html
    )
    assert [(key, title, int(n)) for key, title, n in titles] == [
        ("unknown", "Unknown — needs reconciliation", 1),
        ("cannot_be_undone", "Cannot be undone", 1),
        ("happened", "Happened", 1),
        ("compensated", "Compensated", 0),
        ("did_not_happen", "Did not happen", 1),
    ]
    assert "1 side effect needs reconciliation" in html
    assert "dlv_7" in html
    for key, effect in effects.items():
        section = html.split(f'id="group-{key}"')[1].split('<section id="group-')[0]
        assert effect.operation_id in section, key
    timeline = text(client.get(f"/runs/{run.id}/timeline?events=side_effects", **HTMX))
    assert "Side effect outcome unknown: webhook → deploy-hook" in timeline
    assert re.findall(r'data-type="([a-z_.]+)"', timeline)[0] == "side_effect.begun"


def test_the_run_page_fetches_the_report_and_gets_its_banner(
    client: Client, operator: User, config_dir: Path
) -> None:
    run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    page = text(client.get(f"/runs/{run.id}/"))
    assert f'data-load-url="/side-effects/runs/{run.id}/?origin=run"' in page
    assert f'<div id="run-{run.id}-effects-banner"></div>' in page
    fragment = text(client.get(f"/side-effects/runs/{run.id}/?origin=run", **HTMX))
    assert fragment.lstrip().startswith(f'<div id="run-{run.id}-report"')
    assert f'<div id="run-{run.id}-effects-banner" hx-swap-oob="true">' in fragment
    assert "1 side effect needs reconciliation" in fragment
    assert f'id="run-{run.id}-controls"' not in fragment
    # Reconciling from the run page also refreshes its controls: Retry is now allowed.
    response = reconcile(
        client, effects["unknown"], htmx=True, outcome="not_applied", note="none", origin="run"
    )
    body = text(response)
    assert re.search(
        rf'<div id="run-{run.id}-controls" class="controls"[^>]* hx-swap-oob="true">', body
    )
    assert "Retry this run" in body
    assert "needs reconciliation" not in body.split("effects-banner")[1][:300]


def test_the_retry_panel_previews_what_happens_to_recorded_effects(
    client: Client, operator: User, config_dir: Path
) -> None:
    run, _effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    html = text(client.get(f"/side-effects/runs/{run.id}/retry-preview", **HTMX))
    assert "2 that happened: reused, not done again" in html
    # Unknown is not "looked up": the ledger refuses to begin it again, and the run may not
    # be retried until a person settles it (the ledger's decision table says so).
    assert "1 unknown: no retry until a person settles it" in html
    assert "looked up by key" not in html
    assert "1 that did not happen or was undone: may be attempted again" in html
