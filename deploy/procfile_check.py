"""Start the Procfile's processes locally and prove they work together.

    DATABASE_URL=postgres://… REDIS_URL=redis://… python deploy/procfile_check.py

Runs ``release`` (migrate, collectstatic), starts ``web`` (uvicorn), ``live`` (daphne,
for websockets) and ``worker`` (runagents) exactly as the Procfile says, with
production settings, waits for ``/healthz`` on both web ports, opens the
websocket of the runs list on ``live`` as a signed-in person, starts a run over the API with a token and
waits until the worker process has finished it (the socket hears about it), then stops
all three with SIGTERM and checks they exit cleanly.
Exits non-zero, saying why, when any of that fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def procfile() -> dict[str, str]:
    entries = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fail(message: str) -> None:
    print(f"procfile check: FAILED: {message}", flush=True)
    sys.exit(1)


def http(method: str, url: str, token: str, body: object | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Token {token}")
    request.add_header("Content-Type", "application/json")
    request.add_header("Idempotency-Key", secrets.token_hex(8))
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_healthy(name: str, base: str) -> dict:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                return json.loads(response.read())
        except OSError:
            if time.monotonic() > deadline:
                fail(f"{name} did not answer /healthz within 60 s")
            time.sleep(0.3)


def ws_connect(stack: contextlib.ExitStack, url: str, *, origin: str, cookie: str) -> Any:
    from websockets.sync.client import connect

    try:
        return stack.enter_context(
            connect(url, additional_headers={"Origin": origin, "Cookie": cookie})
        )
    except Exception as exc:  # noqa: BLE001 - any failure to connect fails the check
        fail(f"live refused the runs list's websocket: {exc!r}")


def heard(socket_: object, run_id: str, seconds: float = 10.0) -> bool:
    """A frame naming ``run_id`` arrives within ``seconds``."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            frame = socket_.recv(timeout=left)  # type: ignore[attr-defined]
        except TimeoutError:
            return False
        if run_id in str(frame):
            return True
    return False


def main() -> None:
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        fail("set DATABASE_URL and REDIS_URL: production runs on PostgreSQL and Redis")
    port, live_port = free_port(), free_port()
    var = tempfile.mkdtemp(prefix="holdpoint-procfile-")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PORT": str(port),
        "LIVE_PORT": str(live_port),
        "WEB_CONCURRENCY": "2",
        "HOST": "127.0.0.1",
        "WORKER_CONCURRENCY": "2",
        "HOLDPOINT_PRODUCTION": "1",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        # The check talks plain HTTP on loopback; behind the load balancer this stays on.
        "SECURE_SSL_REDIRECT": "0",
        "HOLDPOINT_VAR_DIR": var,
    }
    entries = procfile()
    for needed in ("release", "web", "live", "worker"):
        if needed not in entries:
            fail(f"the Procfile has no {needed!r} process")
    print(f"procfile check: release: {entries['release']}", flush=True)
    subprocess.run(["bash", "-c", entries["release"]], cwd=ROOT, env=env, check=True)
    processes = {
        name: subprocess.Popen(["bash", "-c", f"exec {entries[name]}"], cwd=ROOT, env=env)
        for name in ("web", "live", "worker")
    }
    sockets = contextlib.ExitStack()
    try:
        base = f"http://127.0.0.1:{port}"
        for name, url in (("web", base), ("live", f"http://127.0.0.1:{live_port}")):
            health = wait_healthy(name, url)
            print(f"procfile check: {name} healthy: {health}", flush=True)
        manage = [sys.executable, "manage.py"]
        username = f"procfile-{secrets.token_hex(3)}"
        session = subprocess.run(
            [
                *manage,
                "shell",
                "-c",
                "from django.contrib.auth.models import User; from runs.groups import ensure_default_groups;"
                "from django.contrib.auth.models import Group; ensure_default_groups();"
                f"u = User.objects.create_user('{username}'); u.groups.add(Group.objects.get(name='operator'));"
                "from django.conf import settings; from django.contrib.sessions.backends.db import SessionStore;"
                "s = SessionStore(); s['_auth_user_id'] = str(u.pk);"
                "s['_auth_user_backend'] = settings.AUTHENTICATION_BACKENDS[0];"
                "s['_auth_user_hash'] = u.get_session_auth_hash(); s.create(); print(s.session_key)",
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[-1]
        runs_list = ws_connect(
            sockets,
            f"ws://127.0.0.1:{live_port}/ws/runs/",
            origin=f"http://127.0.0.1:{live_port}",
            cookie=f"sessionid={session}",
        )
        print("procfile check: live: the runs list's websocket is open", flush=True)
        token = subprocess.run(
            [*manage, "drf_create_token", username],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[2]
        run = http(
            "POST",
            f"{base}/api/runs",
            token,
            {"agent": "flaky-deploy", "input": {"service": "procfile", "mode": "none"}},
        )
        print(f"procfile check: started {run['run_id']} through web", flush=True)
        deadline = time.monotonic() + 60
        while run["status"] != "succeeded":
            if time.monotonic() > deadline:
                fail(
                    f"the worker did not finish {run['run_id']} within 60 s (status {run['status']})"
                )
            time.sleep(0.3)
            run = http("GET", f"{base}/api/runs/{run['run_id']}", token)
        print(f"procfile check: worker finished {run['run_id']}: {run['result']}", flush=True)
        if not heard(runs_list, run["run_id"]):
            fail(f"the runs list's websocket on live heard nothing of {run['run_id']}")
        print("procfile check: live pushed the run's changes to the runs list", flush=True)
    finally:
        sockets.close()
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        codes = {name: process.wait(timeout=60) for name, process in processes.items()}
    if any(code != 0 for code in codes.values()):
        fail(f"processes did not exit cleanly on SIGTERM: {codes}")
    print(
        "procfile check: ok (release, web, live and worker started from the Procfile;"
        " clean SIGTERM)"
    )


if __name__ == "__main__":
    main()
