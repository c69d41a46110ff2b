"""The remote demo workers of ``make run``: one agent of each remote kind beside the
in-process ones, so the dashboard shows them all.

- the Python client: ``holdpoint-worker … holdpoint_client.demo:AGENTS`` (``remote-triage``;
  ``remote-review``, a LangGraph graph, when the ``[langgraph]`` extra is installed; and
  ``remote-status``, an OpenAI Agents SDK agent, when the ``[openai-agents]`` extra is);
- the TypeScript client: ``node clients/typescript/dist/cli.js … examples/demo.mjs:AGENTS``
  (``ts-incident``) when Node is installed and the client is built (``make run`` builds it
  when npm is there).

They are separate processes talking HTTP to this server with a worker token made for
them at each start (``demo-remote``; the previous one is revoked), each by its own name on
the Workers page (``demo-remote-python``, ``demo-remote-typescript``). They declare their
agents, long-poll for work, and are stopped (SIGTERM: leases released) with the server.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from runs.tokens import worker_token_create, worker_token_revoke
from runtime.demo_mcp import start_mcp_demo

logger = logging.getLogger("runtime")

TOKEN_NAME = "demo-remote"


@dataclass
class RemoteDemo:
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def terminate(self) -> None:
        """Ask each to stop (SIGTERM: it releases its leases); ``stop`` waits for them."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 15) -> None:
        self.terminate()
        # One deadline for them all: they stop side by side, not one after another (a
        # worker whose server is already gone retries its release until it gives up).
        deadline = time.monotonic() + timeout
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def start_remote_demo(url: str, receiver_url: str) -> RemoteDemo:
    """Start the remote demo workers against ``url``; say what could not start and why."""
    demo = RemoteDemo()
    worker_token_revoke(name=TOKEN_NAME)
    _, token = worker_token_create(name=TOKEN_NAME)
    env = {
        **os.environ,
        "HOLDPOINT_TOKEN": token,
        "HOLDPOINT_DEMO_RECEIVER": receiver_url,
        "PYTHONUNBUFFERED": "1",
    }
    common = ["--url", url]
    logs = Path(settings.VAR_DIR)
    if importlib.util.find_spec("holdpoint_client") is None:
        demo.skipped["python"] = "pip install ./clients/python"
    else:
        demo.processes["python"] = _spawn(
            [
                sys.executable,
                "-m",
                "holdpoint_client.cli",
                *common,
                "--name",
                "demo-remote-python",
                "holdpoint_client.demo:AGENTS",
            ],
            Path(settings.BASE_DIR),
            env,
            logs / "remote-python.log",
        )
        if importlib.util.find_spec("langgraph") is None:
            demo.skipped["langgraph"] = "pip install './clients/python[langgraph]'"
        if importlib.util.find_spec("agents") is None:
            demo.skipped["openai-agents"] = "pip install './clients/python[openai-agents]'"
        gateway, why = start_mcp_demo(url, token, env, logs / "mcp-gateway.log")
        if gateway is None:
            demo.skipped["mcp"] = why
        else:
            demo.processes["mcp"] = gateway
    client = Path(settings.BASE_DIR) / "clients" / "typescript"
    if shutil.which("node") is None:
        demo.skipped["typescript"] = "Node 20+ is not installed"
    elif not (client / "dist" / "cli.js").exists():
        demo.skipped["typescript"] = "cd clients/typescript && npm ci && npm run build"
    else:
        demo.processes["typescript"] = _spawn(
            [
                "node",
                "dist/cli.js",
                *common,
                "--name",
                "demo-remote-typescript",
                "./examples/demo.mjs:AGENTS",
            ],
            client,
            env,
            logs / "remote-typescript.log",
        )
    return demo


def _spawn(
    command: list[str], cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    logger.info("remote demo worker: %s (log %s)", " ".join(command[:4]), log)
    # Our own fixed command lines (the interpreter, node, the demo modules): no user input.
    return subprocess.Popen(  # noqa: S603
        command, cwd=cwd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
