"""Everything in one process: ``python manage.py serve`` (what ``make run`` starts).

The web server (daphne, ASGI: pages, API, websockets), worker threads that also
sweep, and the demo webhook receiver, in one process. With neither ``DATABASE_URL``
nor ``REDIS_URL`` that is SQLite under ``var/`` and the in-memory channel layer; with
them set, the same command uses PostgreSQL and Redis.

At first start it creates the demo accounts (one generated password, printed once)
and seeds demo runs. Outside production only: with ``HOLDPOINT_PRODUCTION`` on it
neither creates accounts nor seeds. Ctrl-C stops the web server, then each worker
finishes its step and releases its lease.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.migrated import require_migrated
from runtime.demo_mcp import demo_token, mcp_port
from runtime.demo_receiver import DemoReceiver
from runtime.demo_remote import RemoteDemo, start_remote_demo
from runtime.demo_seed import DEMO_ACCOUNTS, DemoDriver, ensure_demo_accounts, seed_demo_runs
from runtime.devloop import hold_worker_lock
from runtime.worker import WorkerPool


def served_url(host: str, port: int) -> str:
    """The address of a server listening on ``host``:``port``, for links: a server on every
    interface is reached here as localhost."""
    if host in ("", "0.0.0.0", "::", "[::]"):  # noqa: S104 - names the wildcard, binds nothing
        host = "localhost"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


# How long Ctrl-C lets running steps (in process and in the remote demo workers) finish.
SHUTDOWN_GRACE_SECONDS = 1.0


class Command(BaseCommand):
    help = "Start the dashboard, workers and demo agents in one process."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--workers",
            type=int,
            default=4,
            help="Worker threads; 0 for the dashboard only (run `runagents --reload` beside it).",
        )
        parser.add_argument(
            "--receiver-port",
            type=int,
            default=8765,
            help="Port of the demo webhook receiver (0: any free port).",
        )
        parser.add_argument("--no-demo", action="store_true", help="No demo accounts or runs.")
        parser.add_argument(
            "--no-remote",
            action="store_true",
            help="Start no remote demo workers (Python client, LangGraph, TypeScript client).",
        )
        parser.add_argument("--no-migrate", action="store_true")
        parser.add_argument(
            "--slack-stub",
            action="store_true",
            help="Post to a local Slack stand-in (runtime/slack_standin.py) and decide there.",
        )
        parser.add_argument("--slack-port", type=int, default=8125)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["workers"] < 0:
            raise CommandError("--workers must be 0 (the dashboard only) or more.")
        if not options["no_migrate"]:
            call_command("migrate", interactive=False, verbosity=0)
        else:
            require_migrated()
        # On SQLite one process runs workers (runtime/devloop.py); held until we exit.
        lock = hold_worker_lock("manage.py serve") if options["workers"] else None  # noqa: F841
        demo = not options["no_demo"] and not settings.PRODUCTION
        if demo:
            # The demo runs post to the demo receiver on loopback, which the outbound
            # guard refuses by default (ledger/outbound.py): allow local destinations
            # for this demo process only, and say so.
            settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = True
        if not settings.HOLDPOINT_PUBLIC_URL:
            # The links of notifications point where this server answers (make run
            # PORT=8123), unless an operator said where people reach the dashboard.
            settings.HOLDPOINT_PUBLIC_URL = served_url(options["host"], options["port"])
        receiver = DemoReceiver("127.0.0.1", options["receiver_port"]).start()
        slack_url = self._slack_stub(options) if options["slack_stub"] else None
        stop = threading.Event()
        pool = (
            WorkerPool(options["workers"], stop_event=stop).start() if options["workers"] else None
        )
        driver = None
        password = None
        if demo:
            password = ensure_demo_accounts(settings.HOLDPOINT_DEMO_PASSWORD or None)
            scenarios = seed_demo_runs(receiver.url)
            if scenarios:
                driver = DemoDriver(scenarios, stop)
                driver.start()
        remote: RemoteDemo | None = None
        if demo and not options["no_remote"]:
            # Separate processes over HTTP; they wait (with backoff) until daphne listens.
            remote = start_remote_demo(f"http://{options['host']}:{options['port']}", receiver.url)
        self._announce(options, receiver, pool, password, demo, remote, slack_url)
        try:
            self._serve(options["host"], options["port"])
        finally:
            # The remote workers and the in-process ones stop side by side.
            if remote is not None:
                remote.terminate()
            self.stdout.write("holdpoint: stopping workers…")
            self.stdout.flush()
            stop.set()
            # Ctrl-C on the dev server stops it within 2 s: a step gets a moment to finish,
            # then its lease is released at once and another start repeats it from its
            # checkpoint (runagents keeps its own --grace-seconds for production).
            # One grace for both, counted from the same moment (not one after the other).
            remote_stop = None
            if remote is not None:
                remote_stop = threading.Thread(
                    target=remote.stop, args=(SHUTDOWN_GRACE_SECONDS,), daemon=True
                )
                remote_stop.start()
            if pool is not None:
                pool.stop(timeout=SHUTDOWN_GRACE_SECONDS)
            if remote_stop is not None:
                remote_stop.join()
            receiver.stop()
            self.stdout.write("holdpoint: stopped; leases released.")
        # Everything durable is committed and every lease released. Skip interpreter
        # finalization: daemon threads (socket hub, push sender) still holding SQLite or
        # channel-layer objects crashed it (SIGSEGV) at exit in a CI run.
        self.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _slack_stub(self, options: dict[str, Any]) -> str:
        """``make run SLACK=stub``: Slack played locally (``runtime/slack_standin.py``), its
        channels for the approvers and the operators, its people linked to the demo
        accounts by their confirmed e-mail addresses (as an administrator may allow)."""
        from runtime import slack_standin

        space = slack_standin.Workspace(holdpoint=served_url(options["host"], options["port"]))
        server = slack_standin.serve(space, "127.0.0.1", options["slack_port"])
        url = f"http://127.0.0.1:{server.server_address[1]}"
        settings.HOLDPOINT_SLACK_BOT_TOKEN = slack_standin.TOKEN
        settings.HOLDPOINT_SLACK_SIGNING_SECRET = slack_standin.SIGNING_SECRET
        settings.HOLDPOINT_SLACK_API_URL = url + "/api/"
        settings.HOLDPOINT_SLACK_CHANNELS = {"approver": "C0APPROVERS", "operator": "C0OPERATORS"}
        settings.HOLDPOINT_SLACK_LINK_BY_EMAIL = True
        settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = True
        return url

    def _serve(self, host: str, port: int) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server
        from twisted.internet import reactor

        from config.asgi import application
        from runs.wakeups import waiter

        # Ctrl-C: long-polling claims and watches answer now instead of holding daphne's
        # shutdown for up to their whole wait.
        # (Twisted declares the method zope-style, without self: mypy misreads its arguments.)
        reactor.addSystemEventTrigger("before", "shutdown", waiter.release_waiters)  # type: ignore[arg-type]
        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=True,
            action_logger=None,
            # Open pages' sockets are cancelled at Ctrl-C; none may hold the exit longer.
            application_close_timeout=1,
            # Websockets live long; pages answer fast.
            websocket_timeout=86400,
        ).run()

    def _announce(
        self,
        options: dict[str, Any],
        receiver: DemoReceiver,
        pool: WorkerPool | None,
        password: str | None,
        demo: bool,
        remote: RemoteDemo | None = None,
        slack_url: str | None = None,
    ) -> None:
        db = settings.DATABASES["default"]
        store = "PostgreSQL" if "postgresql" in str(db["ENGINE"]) else f"SQLite ({db['NAME']})"
        layer = "Redis" if settings.REDIS_URL else "in-memory"
        lines = [
            "",
            f"Holdpoint is running: http://{options['host']}:{options['port']}/",
            f"  store: {store}; channel layer: {layer}; "
            + (
                f"{pool.concurrency} workers for {', '.join(pool.agents)}"
                if pool is not None
                else "no workers: run `python manage.py runagents --reload` beside it"
            ),
            f"  demo webhook receiver: {receiver.url}",
            f"  links in notifications: {settings.HOLDPOINT_PUBLIC_URL}/",
        ]
        if settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL:
            lines.append("  outbound calls may reach local addresses (demo)")
        if slack_url is not None:
            lines.append(
                f"  Slack stand-in: {slack_url}/ (approvals and questions, with their buttons)"
            )
        if remote is not None:
            started = ", ".join(remote.processes) or "none"
            lines.append(f"  remote demo workers (docs/agents.md): {started}")
            lines += [f"    not started: {kind}: {why}" for kind, why in remote.skipped.items()]
            if "mcp" in remote.processes:
                lines.append(
                    f"  MCP gateway (agent mcp-files): http://127.0.0.1:{mcp_port()}/mcp, "
                    f"Authorization: Bearer {demo_token()} (the operator's API token)"
                )
        if password:
            lines += [
                "  accounts (shown once; change with `python manage.py changepassword NAME`):",
                *(f"    {name:<9} {password}" for name in DEMO_ACCOUNTS),
            ]
        elif demo:
            lines.append(
                "  accounts: operator, approver, reviewer, viewer, admin (password shown at "
                "first start)"
            )
        lines.append("  Ctrl-C stops cleanly.")
        self.stdout.write("\n".join(lines) + "\n")
        self.stdout.flush()
