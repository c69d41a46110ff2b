"""Issue 24, point 14: the notification sender as real processes.

(a) A sweep killed with SIGKILL while it sends leaves only the message in flight in doubt:
    the rest of what was due goes with the next sweep at once, not after the lease.
(c) ``make run PORT=…`` (``manage.py serve --port``): the e-mails' links point at the
    address the server serves, unless an operator configured ``HOLDPOINT_PUBLIC_URL``.
"""

from __future__ import annotations

import datetime as dt
import email
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from ledger.notifications import LEASE_SECONDS, notifications_send
from runs.models import Notification
from tests.ledger.test_notifications import person
from tests.runs.factory import interrupted
from tests.waiting import wait_for

# What Django's file e-mail backend writes after each message.
MAIL_SEPARATOR = b"\n" + b"-" * 79 + b"\n"

ROOT = Path(__file__).resolve().parents[2]


def mail_keys(directory: Path) -> list[str]:
    """The ``X-Holdpoint-Key`` of every e-mail the file backend wrote."""
    keys = []
    for path in sorted(directory.glob("*.log")) if directory.is_dir() else []:
        # One file can hold several messages (the backend names files by the second and
        # the id of its connection, which a later connection may reuse): split on the whole
        # separator line, or each message after the first starts with an empty line and
        # reads as having no headers.
        for chunk in path.read_bytes().split(MAIL_SEPARATOR):
            key = email.message_from_bytes(chunk).get("X-Holdpoint-Key") if chunk.strip() else None
            if key:
                keys.append("".join(str(key).split()))
    return keys


class Hooks:
    """Group webhooks on loopback: each POST is recorded by its ``Idempotency-Key``; a POST
    to ``block_path`` is held, unanswered, until the test lets it go (a receiver that hangs
    while the sender is killed)."""

    def __init__(self, block_path: str) -> None:
        self.block_path = block_path
        self.keys: list[str] = []
        self.blocked = threading.Event()
        self.release = threading.Event()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hooks.keys.append(self.headers["Idempotency-Key"])
                if self.path == hooks.block_path and not hooks.blocked.is_set():
                    hooks.blocked.set()
                    hooks.release.wait(120)
                body = b'{"ok": true}'
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the sender was killed: nobody reads the answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    receiver = Hooks(block_path="/hooks/approver")
    yield receiver
    receiver.stop()


@pytest.mark.postgres
@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_sweep_killed_mid_batch_leaves_only_the_message_in_flight_in_doubt(
    hooks: Hooks, settings: Any, tmp_path: Path
) -> None:
    """Six messages are due: the admins' webhook, the approvers' webhook (its receiver
    hangs), e-mails to alice, bob and olivia, and the operators' webhook, in that order.
    A ``manage.py sweep`` process sends the first, is killed with SIGKILL while the second
    hangs, and a second sweep process started at once sends the four after it: only the
    approvers' webhook is left ``sending`` until its lease runs out, and then goes again
    with its key.

    How this fails: a sweep that claims its whole batch before sending (one lease over up
    to 100 rows) leaves all five unsent rows ``sending`` when it dies, and the next sweep
    sends nothing for two minutes.
    """
    webhooks = {g: f"{hooks.base}/hooks/{g}" for g in ("admin", "approver", "operator")}
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_REMIND_SHARE = 0
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 60
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = webhooks
    person("alice"), person("bob"), person("olivia", "operator")
    _run, _lease, _cp, req = interrupted(kind="input_required")
    order = [
        f"{req.id}:group:admin:pending",
        f"{req.id}:group:approver:pending",
        *(
            f"{req.id}:user:{Notification.objects.get(request=req, user__username=n).user_id}:pending"
            for n in ("alice", "bob", "olivia")
        ),
        f"{req.id}:group:operator:pending",
    ]
    assert set(Notification.objects.filter(request=req).values_list("key", flat=True)) == set(order)
    now = timezone.now()
    for index, key in enumerate(order):
        Notification.objects.filter(key=key).update(due_at=now - dt.timedelta(seconds=60 - index))

    mail_dir = tmp_path / "mail"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
        "EMAIL_FILE_PATH": str(mail_dir),
        "HOLDPOINT_NOTIFY_WEBHOOKS": ",".join(f"{g}={u}" for g, u in webhooks.items()),
        "HOLDPOINT_NOTIFY_REMIND_SHARE": "0",
        "HOLDPOINT_OUTBOUND_ALLOW_LOCAL": "true",
        "HOLDPOINT_PUBLIC_URL": "https://holdpoint.example",
        "PYTHONUNBUFFERED": "1",
    }

    def sweep(log: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "manage.py", "sweep", "--once"],
            cwd=ROOT,
            env=env,
            stdout=(tmp_path / log).open("wb"),
            stderr=subprocess.STDOUT,
        )

    first = sweep("first.log")
    try:
        wait_for(hooks.blocked.is_set, 120, "the sweep to POST to the approvers' webhook")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(60)
    killed_at = time.monotonic()
    hooks.release.set()
    assert hooks.keys == order[:2]

    def status(key: str) -> str:
        return str(Notification.objects.get(key=key).status)

    assert status(order[0]) == "sent"
    in_doubt = Notification.objects.get(key=order[1])
    assert in_doubt.status == "sending" and in_doubt.locked_until > timezone.now()
    # Only that message: the rest is still simply due.
    assert [status(key) for key in order[2:]] == ["pending"] * 4

    second = sweep("second.log")
    assert second.wait(120) == 0, (tmp_path / "second.log").read_text()
    # At once: the lease of the message in doubt has not run out.
    assert time.monotonic() - killed_at < LEASE_SECONDS
    assert [status(key) for key in order] == ["sent", "sending", "sent", "sent", "sent", "sent"]
    assert sorted(mail_keys(mail_dir)) == sorted(order[2:5])
    assert hooks.keys == [*order[:2], order[5]]

    # When its lease has run out, the message in doubt goes again, with its key.
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=LEASE_SECONDS + 1), tick=False):
        assert notifications_send() == 1
    assert hooks.keys == [*order[:2], order[5], order[1]]
    assert status(order[1]) == "sent"


# --- (c) The links use the address the server serves -------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def serve_and_read_a_mail(tmp_path: Path, **env: str) -> tuple[int, str]:
    """Start ``manage.py serve`` (what ``make run`` runs) on a free port with its demo runs,
    and return the port and the first notification e-mail it writes."""
    port = free_port()
    var, mail_dir = tmp_path / "var", tmp_path / "mail"
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "HOLDPOINT_PUBLIC_URL"}
    }
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "serve",
            "--port",
            str(port),
            "--receiver-port",
            "0",
            "--workers",
            "2",
            "--no-remote",
        ],
        cwd=ROOT,
        env={
            **base,
            "HOLDPOINT_VAR_DIR": str(var),
            "HOLDPOINT_DEMO_PASSWORD": "demo-pass-for-tests",
            "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "EMAIL_FILE_PATH": str(mail_dir),
            "PYTHONUNBUFFERED": "1",
            **env,
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    try:

        def notification_mail() -> str | None:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            # The demo's e-mail tool writes to the same folder: a notification has its key.
            for path in sorted(mail_dir.glob("*.log")) if mail_dir.is_dir() else []:
                for chunk in path.read_bytes().split(MAIL_SEPARATOR):
                    if chunk.strip() and email.message_from_bytes(chunk).get("X-Holdpoint-Key"):
                        return chunk.decode(errors="replace")
            return None

        wait_for(notification_mail, 180, "the demo's first notification e-mail")
        text = notification_mail() or ""
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()
    return port, text


@pytest.mark.process
@pytest.mark.parametrize("configured", [None, "https://holdpoint.example.com"])
def test_make_run_on_another_port_links_to_that_port(
    tmp_path: Path, configured: str | None
) -> None:
    """Unset, ``HOLDPOINT_PUBLIC_URL`` is the address ``serve`` serves; set, it wins."""
    port, text = serve_and_read_a_mail(
        tmp_path, **({"HOLDPOINT_PUBLIC_URL": configured} if configured else {})
    )
    links = re.findall(r"Open it \(after signing in\): (\S+)", text) or re.findall(
        r"(https?://\S+/runs/\S+)", text
    )
    assert links, text
    base = configured or f"http://127.0.0.1:{port}"
    assert all(link.startswith(f"{base}/runs/run_") for link in links), links


def test_a_server_on_every_interface_is_linked_as_localhost() -> None:
    from runtime.management.commands.serve import served_url

    assert served_url("127.0.0.1", 8123) == "http://127.0.0.1:8123"
    assert served_url("0.0.0.0", 8123) == "http://localhost:8123"
    assert served_url("::1", 8123) == "http://[::1]:8123"
