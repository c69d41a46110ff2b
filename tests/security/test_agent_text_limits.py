"""Issue 25, points 5 and 6: what agents declare can never fail a page or stall the web
tier.

5. A declared label was a Python format string: ``"Probe {note:>4000000000000000000}"``
   raised MemoryError (500 on ``/runs/``, the run page and every inbox while one of its
   questions waited) and ``{note.__class__.__mro__}`` rendered Python's internals. A label
   is literal text and ``{field}`` names only, at most 200 characters, refused otherwise
   when declared; and filling one never fails.
6. An ``editable`` schema with pattern ``^(a+)+$`` and the value ``"a" * 24 + "!"`` took 2 s,
   doubling per character. Patterns run in RE2 (linear time); patterns RE2 cannot run
   (look-around, back-references) are refused when a schema is given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.test import Client

from runs import services
from runs.agents import run_label
from runs.errors import HoldpointError
from runs.models import DeclaredAgent
from runs.schemas import compile_schema, schema_problems
from tests.api.conftest import client_for, post, worker_client
from tests.api.test_worker_protocol import claim, declare, fenced, url

pytestmark = pytest.mark.django_db

EVIL_PATTERN = "^(a+)+$"


# --- 5. Labels -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label",
    [
        "Probe {note:>4000000000000000000}",
        "Probe {note.__class__.__mro__}",
        "Probe {note[0]}",
        "Probe {note!r}",
        "Probe {0}",
        "Probe {}",
        "Probe {note",
        "Probe } {note}",
        "x" * 201,
    ],
)
def test_a_label_that_is_not_a_template_of_field_names_is_refused(label: str) -> None:
    response = declare(
        worker_client("w-label"), "probe", {"input_schema": {"note": "string"}, "label": label}
    )
    assert response.status_code == 422, response.content[:300]
    assert response.json()["code"] == "invalid_input"
    assert not DeclaredAgent.objects.filter(name="probe").exists()


def test_a_label_never_fails_a_page_even_if_stored_before_the_rule(
    client: Client, operator: Any
) -> None:
    """A label stored by an older server (or written into the table) renders as the
    default, and the pages that draw it answer 200."""
    declare(
        worker_client("w-old"),
        "probe",
        {"input_schema": {"note": "string"}, "label": "Probe {note}"},
    )
    DeclaredAgent.objects.filter(name="probe").update(label="Probe {note:>4000000000000000000}")
    from runs.agents import forget_declared_labels

    forget_declared_labels()
    run = services.run_start(agent="probe", input={"note": "n"})
    assert run_label("probe", {"note": "n"}, run.id).startswith("probe · ")
    client.force_login(operator)
    for page in ("/runs/", f"/runs/{run.id}/", "/"):
        assert client.get(page).status_code == 200, page


def test_a_good_label_fills_field_names_on_one_line() -> None:
    declare(
        worker_client("w-good"),
        "probe",
        {"input_schema": {"note": "string"}, "label": "Probe {note} for {who}"},
    )
    from runs.agents import forget_declared_labels

    forget_declared_labels()
    assert run_label("probe", {"note": "a\nb", "who": "ops"}, "run_1") == "Probe a b for ops"
    assert run_label("probe", {"note": "x"}, "run_ABCDEF").startswith("probe · ")  # who missing


# --- 6. Patterns -----------------------------------------------------------------------------


def _validate_in_a_process(pattern: str, value: str, seconds: float = 60.0) -> list[str]:
    """Validate ``value`` against ``{"pattern": pattern}`` in a child process; return the
    problems' kinds, or fail if it has not finished in ``seconds`` (generous: RE2 answers in
    microseconds; the backtracking engine took 2 s at 24 characters and would take days at
    60, holding the interpreter's lock all along, which is why it runs in a process of its
    own: a thread would starve this one)."""
    code = (
        "import json, sys, django; django.setup()\n"
        "from runs.schemas import compile_schema, schema_problems\n"
        "schema = compile_schema({'type': 'string', 'pattern': sys.argv[1]})\n"
        "print(json.dumps([p.kind for p in schema_problems(schema, sys.argv[2])]))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, pattern, value],
            capture_output=True,
            text=True,
            timeout=seconds,
            env=env,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"validating against {pattern!r} still ran after {seconds} s")
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_catastrophic_pattern_is_matched_in_linear_time() -> None:
    assert _validate_in_a_process(EVIL_PATTERN, "a" * 60 + "!") == ["pattern"]
    assert _validate_in_a_process(EVIL_PATTERN, "a" * 60) == []


def test_json_schemas_end_is_the_end_of_the_text() -> None:
    schema = compile_schema({"type": "string", "pattern": "^[a-z]+$"})
    assert schema_problems(schema, "abc") == []
    assert [p.kind for p in schema_problems(schema, "abc\n")] == ["pattern"]


@pytest.mark.parametrize("pattern", ["(?=x)y", r"(a)\1", "(?<!a)b"])
def test_a_pattern_re2_cannot_run_is_refused_when_given(pattern: str) -> None:
    with pytest.raises(HoldpointError) as refused:
        compile_schema(
            {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}}
        )
    assert refused.value.code == "invalid_input"
    assert refused.value.extra["errors"][0]["pointer"] == "/properties/v/pattern"
    with pytest.raises(HoldpointError):
        compile_schema({"type": "object", "patternProperties": {pattern: {"type": "string"}}})


@pytest.mark.timeout(120)  # the backtracking engine would take days here; RE2 microseconds
def test_an_edit_against_a_catastrophic_pattern_does_not_stall_the_resume(approver: Any) -> None:
    """The issue's finding, over HTTP: an approval whose editable schema has the pattern;
    the approver's edit is refused at once with a pointer. (In this thread: the test's
    database transaction is not another thread's.)"""
    run = services.run_start(agent="test-agent", input={"n": 1})
    worker = worker_client("w-re")
    lease = claim(worker)
    saved = post(worker, url(lease, "checkpoint"), fenced(lease, step="s", state={}))
    asked = post(
        worker,
        url(lease, "interrupt"),
        fenced(
            lease,
            checkpoint_id=saved.json()["checkpoint_id"],
            kind="auth_required",
            prompt="Rename?",
            step_id="s.approve",
            action={
                "tool": "rename",
                "target": "t",
                "change": {"name": "aaa"},
                "editable": {
                    "schema": {
                        "type": "object",
                        "properties": {"name": {"type": "string", "pattern": EVIL_PATTERN}},
                    },
                    "value": {"name": "aaa"},
                },
            },
        ),
    )
    assert asked.status_code == 201, asked.content[:300]
    request = run.input_requests.get()
    edited = {"name": "a" * 60 + "!"}
    response = post(
        client_for(approver),
        f"/api/runs/{run.pk}/resume",
        {
            "request_id": request.id,
            "checkpoint_id": request.checkpoint_id,
            "value": {"decision": "approve", "edited": edited},
        },
        key="re",
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/value/edited/name"
