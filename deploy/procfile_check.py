"""Start the Procfile's processes locally and prove they work together.

    DATABASE_URL=postgres://… REDIS_URL=redis://… python deploy/procfile_check.py

Runs ``release`` (migrate, collectstatic), starts ``web`` (daphne) and ``worker``
(runagents) exactly as the Procfile says, with production settings, waits for
``/healthz``, starts a run over the API with a token and waits until the worker
process has finished it, then stops both with SIGTERM and checks they exit cleanly.
Exits non-zero, saying why, when any of that fails.
"""

from __future__ import annotations

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


def main() -> None:
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        fail("set DATABASE_URL and REDIS_URL: production runs on PostgreSQL and Redis")
    port = free_port()
    var = tempfile.mkdtemp(prefix="holdpoint-procfile-")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PORT": str(port),
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
    for needed in ("release", "web", "worker"):
        if needed not in entries:
            fail(f"the Procfile has no {needed!r} process")
    print(f"procfile check: release: {entries['release']}", flush=True)
    subprocess.run(["bash", "-c", entries["release"]], cwd=ROOT, env=env, check=True)
    processes = {
        name: subprocess.Popen(["bash", "-c", f"exec {entries[name]}"], cwd=ROOT, env=env)
        for name in ("web", "worker")
    }
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:
                    health = json.loads(response.read())
                    break
            except OSError:
                if time.monotonic() > deadline:
                    fail("web did not answer /healthz within 60 s")
                time.sleep(0.3)
        print(f"procfile check: web healthy: {health}", flush=True)
        manage = [sys.executable, "manage.py"]
        username = f"procfile-{secrets.token_hex(3)}"
        subprocess.run(
            [
                *manage,
                "shell",
                "-c",
                "from django.contrib.auth.models import User; from runs.groups import ensure_default_groups;"
                "from django.contrib.auth.models import Group; ensure_default_groups();"
                f"u = User.objects.create_user('{username}'); u.groups.add(Group.objects.get(name='operator'))",
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
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
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        codes = {name: process.wait(timeout=60) for name, process in processes.items()}
    if any(code != 0 for code in codes.values()):
        fail(f"processes did not exit cleanly on SIGTERM: {codes}")
    print("procfile check: ok (release, web and worker started from the Procfile; clean SIGTERM)")


if __name__ == "__main__":
    main()
