"""Issue 19, point 7: the command line does what the API and the dashboard do, through the
same services: cancelrun, retryrun [--from-checkpoint], inbox, reconcile; watchrun shows
the data fields of ctx.log."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from ledger.models import SideEffect
from runs import services
from runs.models import Checkpoint, RunEvent
from tests.ledger.conftest import config_dir as config_dir
from tests.ledger.helpers import begin, fail_unknown
from tests.runs.factory import claim, epochs, start
from tests.runtime.conftest import fresh, run_next

pytestmark = pytest.mark.django_db

CONFIG = {"document": "staging/app", "content": {"ttl": 60}}


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_cancelrun_cancels_through_the_service(operator: Any) -> None:
    run = start()
    assert cli("cancelrun", run.id, "--reason", "wrong target", "--as", operator.username) == (
        f"{run.id}: cancelled\n"
    )
    cancelled = RunEvent.objects.filter(run_id=run.id, type="run.cancelled").get()
    assert cancelled.actor == f"user:{operator.username}"
    with pytest.raises(CommandError, match="invalid_state"):
        cli("cancelrun", run.id)
    with pytest.raises(CommandError, match="no user 'nobody'"):
        cli("cancelrun", run.id, "--as", "nobody")


def test_retryrun_goes_on_from_the_latest_or_a_named_checkpoint(operator: Any) -> None:
    run = start()
    lease = claim()
    first = services.checkpoint_save(**epochs(lease), step="one", state={"n": 1})
    services.checkpoint_save(**epochs(lease), step="two", state={"n": 2})
    services.attempt_fail(
        **epochs(lease), error={"class": "deterministic", "type": "Bad", "message": "no"}
    )
    assert fresh(run).status == "failed"
    out = cli(
        "retryrun",
        run.id,
        "--reason",
        "fixed",
        "--from-checkpoint",
        first.id,
        "--as",
        operator.username,
    )
    assert out == f"{run.id}: queued\n"
    assert claim("w2").resume_from["checkpoint_id"] == first.id
    with pytest.raises(CommandError, match=r"invalid_state|retry_not_allowed"):
        cli("retryrun", run.id, "--reason", "again")


def test_inbox_lists_what_waits_for_a_person(approver: Any, operator: Any, make_agent: Any) -> None:
    assert cli("inbox") == "Nothing is waiting for a person.\n"
    agent = make_agent()

    @agent.step
    def ask(ctx: Any, state: Any) -> Any:
        ctx.ask("Which region?", {"region": "string"})
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    listing = cli("inbox")
    assert "input_required" in listing and run.id in listing and "Which region?" in listing
    assert "Which region?" in cli("inbox", "--as", operator.username)  # may answer
    assert "answerrun" in cli("inbox", "--long")


def test_reconcile_settles_an_unknown_effect(config_dir: Path, operator: Any) -> None:
    start()
    lease = claim()
    op = begin(lease, tool="config_store", target="app", request=CONFIG).operation_id
    services_record_unknown(op, lease)
    out = cli(
        "reconcile",
        op,
        "confirmed",
        "--note",
        "version 1 is on disk",
        "--reference",
        "staging/app@v1",
        "--as",
        operator.username,
    )
    assert out == f"{op}: confirmed\n"
    effect = SideEffect.objects.get(pk=op)
    assert (effect.external_reference, effect.resolution_note) == (
        "staging/app@v1",
        "version 1 is on disk",
    )
    with pytest.raises(CommandError, match="invalid_state"):
        cli("reconcile", op, "not_applied", "--note", "no")


def services_record_unknown(op: str, lease: Any) -> None:
    from ledger import services as ledger

    effect = ledger.side_effect_record_outcome(
        operation_id=op,
        status="unknown",
        error={"message": "timed out"},
        **{k: v for k, v in epochs(lease).items() if k != "attempt_id"},
    )
    fail_unknown(lease, effect)


def test_watchrun_shows_the_data_of_ctx_log(make_agent: Any) -> None:
    agent = make_agent()

    @agent.step
    def work(ctx: Any, state: Any) -> Any:
        ctx.log("rolled out", image="checkout:4adf", replicas=3)
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    out = cli("watchrun", run.id)
    assert '[info] work: rolled out image="checkout:4adf" replicas=3' in out
    assert Checkpoint.objects.filter(run_id=run.id).exists()
