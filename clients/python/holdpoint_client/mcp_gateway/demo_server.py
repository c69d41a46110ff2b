"""A small downstream MCP server for the gateway's demo and tests (the official SDK's
``MCPServer``): it reads and writes files under one folder, and can fail.

- ``read_file`` (``readOnlyHint``): a file's text.
- ``write_file`` (``destructiveHint``): replace a file's text. The gateway passes its
  ledger key in ``_meta`` (``holdpoint/idempotency_key``); the server keeps a journal of
  the keys it has written (``.journal.json``), so a write the gateway lost sight of can be
  looked up by key (``find_write``) instead of being made twice.
- ``find_write`` (``readOnlyHint``): what the journal says about a key.
- ``fail``: always answers an error.

``--slow-write SECONDS`` makes ``write_file`` wait after writing, before it answers: the
window a test uses to kill the gateway between the call and its outcome.

    python -m holdpoint_client.mcp_gateway.demo_server --root /tmp/files --http 127.0.0.1:8765
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

KEY = "holdpoint/idempotency_key"


def build(root: Path, slow_write: float = 0.0) -> MCPServer:
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    journal = root / ".journal.json"
    server = MCPServer("demo-files", instructions="Files under one folder.")

    def inside(path: str) -> Path:
        target = (root / path).resolve()
        if root not in target.parents:
            raise ValueError(f"{path!r} is outside the folder")
        return target

    def read_journal() -> dict[str, Any]:
        return json.loads(journal.read_text()) if journal.exists() else {}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def read_file(path: str) -> str:
        """Read a file's text."""
        return inside(path).read_text()

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    async def write_file(path: str, text: str, ctx: Context) -> CallToolResult:
        """Replace a file's text."""
        key = _key_of(ctx)
        target = inside(path)
        target.write_text(text)
        if key:
            entries = read_journal()
            entries[key] = {"path": path, "bytes": len(text.encode())}
            journal.write_text(json.dumps(entries))
        with (root / ".writes.log").open("a") as log:
            log.write(json.dumps({"path": path, "text": text, "key": key}) + "\n")
        written = {"path": path, "bytes": len(text.encode())}
        # What a server reports while it works (the gateway logs it on the run), and
        # what the call cost (the gateway adds it to the run's cost).
        await ctx.report_progress(1, 1, f"wrote {written['bytes']} bytes to {path}")
        if slow_write:
            await anyio.sleep(slow_write)
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(written))],
            structured_content=written,
            _meta={"holdpoint/cost": "0.002"},
        )

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def find_write(idempotency_key: str) -> dict[str, Any]:
        """Whether a write with this key happened (the gateway's look-up)."""
        entry = read_journal().get(idempotency_key)
        return {"found": entry is not None, "result": entry}

    @server.tool()
    def fail(reason: str = "it always fails") -> str:
        """Always fails."""
        raise ToolError(reason)

    return server


def _key_of(ctx: Context) -> str | None:
    meta = getattr(ctx, "meta", None)
    if meta is None:
        meta = getattr(getattr(ctx, "request_context", None), "meta", None)
    if meta is None:
        return None
    if isinstance(meta, dict):
        return meta.get(KEY)
    extra = getattr(meta, "model_extra", None) or {}
    return extra.get(KEY) or getattr(meta, KEY, None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.environ.get("DEMO_FILES_ROOT", "demo-files"))
    parser.add_argument("--http", default="", help="host:port for Streamable HTTP (else stdio)")
    parser.add_argument("--slow-write", type=float, default=0.0)
    args = parser.parse_args(argv)
    server = build(Path(args.root), args.slow_write)
    if args.http:
        host, _, port = args.http.rpartition(":")
        server.run("streamable-http", host=host or "127.0.0.1", port=int(port))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
