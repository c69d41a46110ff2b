"""``make run``'s MCP gateway demo: the demo file server (``holdpoint_client.mcp_gateway.
demo_server``, over stdio) behind ``holdpoint-mcp-gateway`` on ``MCP_PORT`` (8770), whose
sessions are runs of the agent ``mcp-files``. Its write tool is gated: an MCP client's
``files__write_file`` waits on the inbox for an approval (docs/agents.md, "The MCP
gateway").

An MCP client presents a person's API token (``demo_token``: the demo operator's, printed
at the start); the gateway serves the sessions' runs with the remote demo's worker token.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model

AGENT = "mcp-files"


def mcp_port() -> int:
    return int(os.environ.get("MCP_PORT", "8770"))


def demo_token() -> str:
    """The demo operator's API token: what an MCP client of the demo gateway presents
    (``Authorization: Bearer …``)."""
    from rest_framework.authtoken.models import Token

    operator = get_user_model().objects.filter(username="operator").first()
    if operator is None:
        return ""
    return Token.objects.get_or_create(user=operator)[0].key


def start_mcp_demo(
    url: str, worker_token: str, env: dict[str, str], log: Path
) -> tuple[subprocess.Popen[bytes] | None, str]:
    """Start the gateway; answer the process, or None and why it could not start."""
    if importlib.util.find_spec("mcp") is None:
        return None, "pip install './clients/python[mcp]'"
    if not demo_token():
        return None, "the demo accounts are missing"
    var = Path(settings.VAR_DIR)
    config = var / "mcp-gateway.toml"
    command = [sys.executable, "-m", "holdpoint_client.mcp_gateway.demo_server"]
    command += ["--root", str(var / "mcp-files")]
    config.write_text(
        "\n".join(
            [
                f"agent = {json.dumps(AGENT)}",
                f"holdpoint_url = {json.dumps(url)}",
                "[servers.files]",
                f"command = {json.dumps(command)}",
                'lookup = "find_write"',
                "",
            ]
        )
    )
    log.parent.mkdir(parents=True, exist_ok=True)
    # Our own fixed command line (the interpreter and the gateway module): no user input.
    proc = subprocess.Popen(  # noqa: S603
        [
            sys.executable,
            "-m",
            "holdpoint_client.mcp_gateway.server",
            "--config",
            str(config),
            "--http",
            f"127.0.0.1:{mcp_port()}",
        ],
        cwd=settings.BASE_DIR,
        env={
            **env,
            "HOLDPOINT_WORKER_TOKEN": worker_token,
        },
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    return proc, ""
