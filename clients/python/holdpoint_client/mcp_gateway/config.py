"""The gateway's settings: a TOML file, with the secrets taken from the environment.

```toml
agent = "files-gateway"            # the Holdpoint agent whose runs the sessions are
holdpoint_url = "http://127.0.0.1:8000"
# Tokens come from the environment, never from the file:
#   HOLDPOINT_WORKER_TOKEN  (hpw_…: claims the sessions' attempts, writes the ledger)
#   HOLDPOINT_API_TOKEN     (--stdio only: the person whose session it is; over HTTP each
#                            client presents its own, Authorization: Bearer <API token>)
wait_seconds = 20                  # how long a gated call is held open without progress
progress_wait_seconds = 600        # … and with a progress token (progress every 5 s)
idle_seconds = 1800                # a session without a call for this long ends its run
calls_per_minute = 120             # per person

[servers.files]                    # a downstream MCP server, by name
command = ["python", "-m", "holdpoint_client.mcp_gateway.demo_server", "--root", "files"]
# or: url = "http://127.0.0.1:8765/mcp"
lookup = "find_write"              # optional: the tool that looks a write up by its key
```
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class ConfigError(ValueError):
    """The settings file says something the gateway cannot run with."""


@dataclass(frozen=True)
class Downstream:
    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    lookup: str = ""


@dataclass(frozen=True)
class Config:
    agent: str
    holdpoint_url: str
    worker_token: str
    api_token: str
    servers: tuple[Downstream, ...]
    wait_seconds: float = 20.0
    progress_wait_seconds: float = 600.0
    max_sessions: int = 16
    calls_per_minute: int = 120
    idle_seconds: float = 1800.0
    lease_seconds: float | None = None

    @property
    def by_name(self) -> dict[str, Downstream]:
        return {server.name: server for server in self.servers}


def load(path: str | Path, environ: dict[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return parse(raw, env)


def parse(raw: dict[str, Any], env: Any) -> Config:
    agent = raw.get("agent")
    if not isinstance(agent, str) or not 1 <= len(agent) <= 100:
        raise ConfigError("agent: the Holdpoint agent's name (1 to 100 characters) is required")
    servers = raw.get("servers")
    if not isinstance(servers, dict) or not servers:
        raise ConfigError("servers: name at least one downstream MCP server")
    downstream = []
    for name, spec in servers.items():
        if not SERVER_NAME.match(name):
            raise ConfigError(f"servers.{name}: a name is [a-z0-9][a-z0-9_-]*, at most 64")
        if not isinstance(spec, dict):
            raise ConfigError(f"servers.{name}: a table with command or url")
        command = spec.get("command") or []
        url = spec.get("url") or ""
        if bool(command) == bool(url):
            raise ConfigError(f"servers.{name}: give exactly one of command (stdio) or url")
        if command and not (
            isinstance(command, list) and all(isinstance(part, str) for part in command)
        ):
            raise ConfigError(f"servers.{name}.command: a list of strings")
        downstream.append(
            Downstream(
                name=name,
                command=tuple(command),
                url=str(url),
                env={str(k): str(v) for k, v in (spec.get("env") or {}).items()},
                lookup=str(spec.get("lookup") or ""),
            )
        )
    worker_token = env.get("HOLDPOINT_WORKER_TOKEN", "")
    api_token = env.get("HOLDPOINT_API_TOKEN", "")
    if not worker_token:
        raise ConfigError(
            "HOLDPOINT_WORKER_TOKEN (hpw_…) must be set in the environment: it serves the "
            "sessions' runs"
        )
    lease = raw.get("lease_seconds")
    return Config(
        agent=agent,
        holdpoint_url=str(
            raw.get("holdpoint_url") or env.get("HOLDPOINT_URL") or "http://127.0.0.1:8000"
        ),
        worker_token=worker_token,
        api_token=api_token,
        servers=tuple(downstream),
        wait_seconds=_number(raw, "wait_seconds", 20.0, 0.0, 3600.0),
        progress_wait_seconds=_number(raw, "progress_wait_seconds", 600.0, 0.0, 86400.0),
        max_sessions=int(_number(raw, "max_sessions", 16, 1, 1000)),
        calls_per_minute=int(_number(raw, "calls_per_minute", 120, 1, 100_000)),
        idle_seconds=_number(raw, "idle_seconds", 1800.0, 1.0, 7 * 86400.0),
        lease_seconds=_number(raw, "lease_seconds", 0.0, 1.0, 3600.0) if lease else None,
    )


def _number(raw: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{name}: a number from {low:g} to {high:g}")
    return float(value)
