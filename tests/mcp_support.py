"""The MCP gateway's test parts, for the client tests and the browser tests: a downstream
MCP server (the demo file server) and gateways, each a real process, and a real MCP client
call (``mcp.Client`` over Streamable HTTP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from runs.models import Run
from tests.live.server import free_port
from tests.waiting import wait_for

AGENT = "files-gateway"


@dataclass
class Proc:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    token: str = ""  # a gateway's: the API token its test client presents

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", *args, f"127.0.0.1:{port}"],
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    started = Proc(f"http://127.0.0.1:{port}/mcp", proc, log)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{args[0]} exited: {started.text()}")
        try:
            httpx.get(started.url, timeout=2)
        except httpx.TransportError:
            return False
        return True

    wait_for(up, 60, f"{args[0]} to answer")
    return started


@dataclass
class Launcher:
    """Starts downstream servers and gateways for one test; ``stop`` ends them all."""

    tmp: Path
    files: Path
    holdpoint_url: str
    worker_token: str
    api_token: str
    lease: float
    started: list[Proc] = field(default_factory=list)

    def downstream(self, slow_write: float = 0.0) -> Proc:
        args = ["holdpoint_client.mcp_gateway.demo_server", "--root", str(self.files)]
        args += ["--slow-write", str(slow_write), "--http"]
        proc = _spawn(args, self.tmp / f"downstream-{len(self.started)}.log")
        self.started.append(proc)
        return proc

    def gateway(self, down: Proc, *, lookup: bool = True, extra: tuple[str, ...] = ()) -> Proc:
        config = self.tmp / f"gateway-{len(self.started)}.toml"
        lines = [
            f'agent = "{AGENT}"',
            f'holdpoint_url = "{self.holdpoint_url}"',
            "wait_seconds = 3",
            *extra,
            f"lease_seconds = {self.lease}",
            "[servers.files]",
            f'url = "{down.url}"',
        ]
        config.write_text("\n".join([*lines, *(['lookup = "find_write"'] if lookup else [])]))
        proc = _spawn(
            ["holdpoint_client.mcp_gateway.server", "--config", str(config), "--http"],
            self.tmp / f"gateway-{len(self.started)}.log",
            {"HOLDPOINT_WORKER_TOKEN": self.worker_token},
        )
        proc.token = self.api_token
        self.started.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.started:
            if proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGTERM)
        for proc in self.started:
            try:
                proc.proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.proc.kill()
                proc.proc.wait(5)


def client_for(url: str, token: str) -> Any:
    """An MCP client of ``url`` that presents ``token`` (``Authorization: Bearer``)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(url, http_client=http))


def call(
    gateway: Proc,
    tool: str,
    arguments: dict[str, Any],
    session: str,
    *,
    token: str | None = None,
    **options: Any,
) -> Any:
    """One ``tools/call`` from a fresh client connection, as the person of ``token`` (the
    gateway's test person by default); ``_meta["holdpoint/session"]`` puts it in the same
    gateway session (run) as the test's other calls."""
    import anyio

    async def go() -> Any:
        async with client_for(gateway.url, token or gateway.token) as client:
            return await client.call_tool(
                tool,
                arguments,
                meta={"holdpoint/session": session},
                read_timeout_seconds=60,
                **options,
            )

    # In a thread of its own: the browser tests' thread runs Playwright's event loop.
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = anyio.run(go)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


def writes(files: Path) -> list[dict[str, Any]]:
    log = files / ".writes.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def run_of(session: str) -> Run:
    def found() -> Run | None:
        # The gateway keys a session by its person too: "<token hash>:<session>".
        return Run.objects.filter(agent=AGENT, input__session__endswith=f":{session}").first()

    return wait_for(found, 30, f"the run of session {session}")


def status_of(result: Any) -> str:
    return (result.meta or {}).get("holdpoint/status", "")
