"""How many application files an approver's POST crosses from URL to commit (issue 26:
about 31 before; at most 15 now). Counted by tracing which of our own modules run while the
dashboard's answer view handles one approval, from the request's arrival until the service
(``run_resume``, whose transaction commits as it returns) returns; listed in
docs/architecture.md ("The lifecycle of one resume")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.dashboard.support import answer
from tests.runs.factory import interrupted

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
APPS = ("config", "runs", "ledger", "runtime", "api", "dashboard", "live")
MAX_FILES = 15


def _files_run_by(call: Any, *, since: tuple[str, str], until: str) -> list[str]:
    """Our modules that run from the call of the view ``since`` (its file, its function: the
    URL resolved; the middleware and the session before it are the framework's path, the
    same for every page) until the function ``until`` (the service, whose transaction
    commits as it returns) returns."""
    seen: set[str] = set()
    started = done = False

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal done, started
        if done:
            return
        code = frame.f_code
        if event == "call" and code.co_name == since[1] and code.co_filename.endswith(since[0]):
            started = True
        if not started:
            return
        if event == "return" and frame.f_code.co_name == until:
            done = True
            return
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path.startswith(str(ROOT)):
            relative = Path(path).relative_to(ROOT)
            if relative.parts[0] in APPS and "migrations" not in relative.parts:
                seen.add(str(relative))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return sorted(seen)


def test_an_approvers_post_crosses_at_most_15_application_files(
    client: Client, approver: User, capsys: Any
) -> None:
    _run, _lease, _cp, req = interrupted(kind="auth_required")
    client.force_login(approver)
    client.get("/")  # a page first, as the approver does: imports and caches are warm
    files = _files_run_by(
        lambda: answer(client, req, {"decision": "approve"}),
        since=("dashboard/views/inbox.py", "request_answer"),
        until="run_resume",
    )
    req.refresh_from_db()
    assert req.status == "answered"
    with capsys.disabled():
        print(f"\n{len(files)} application files:", *files, sep="\n  ")
    assert len(files) <= MAX_FILES, files


def test_an_approvers_post_over_the_api_crosses_at_most_15_application_files(
    approver: User, capsys: Any
) -> None:
    from tests.api.conftest import client_for, post

    run, _lease, cp, req = interrupted(kind="auth_required")
    person = client_for(approver)
    person.get(f"/api/runs/{run.pk}")
    body = {"request_id": req.id, "checkpoint_id": cp.id, "value": {"decision": "approve"}}
    files = _files_run_by(
        lambda: post(person, f"/api/runs/{run.pk}/resume", body, key="k"),
        since=("api/control.py", "post"),
        until="run_resume",
    )
    req.refresh_from_db()
    assert req.status == "answered"
    with capsys.disabled():
        print(f"\n{len(files)} application files over the API:", *files, sep="\n  ")
    assert len(files) <= MAX_FILES, files
