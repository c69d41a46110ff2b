"""The gateway's MCP face: the official SDK's low-level ``Server``, over Streamable HTTP or
stdio, and the command ``holdpoint-mcp-gateway``.

    holdpoint-mcp-gateway --config gateway.toml --http 127.0.0.1:8770   # …/mcp
    holdpoint-mcp-gateway --config gateway.toml --stdio                 # one session
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

from holdpoint_client.mcp_gateway.config import ConfigError, load
from holdpoint_client.mcp_gateway.gateway import KEY_META, SESSION_META, Gateway, new_session_key

logger = logging.getLogger("holdpoint.mcp_gateway")


def _meta(params: Any) -> dict[str, Any]:
    meta = getattr(params, "meta", None)
    return dict(meta) if isinstance(meta, dict) else {}


def session_key(ctx: Any, meta: dict[str, Any], fallback: str) -> str:
    """Which session a request belongs to: the client's ``_meta["holdpoint/session"]``,
    else the transport's session id (Streamable HTTP), else ``fallback`` (stdio: one)."""
    given = meta.get(SESSION_META)
    if isinstance(given, str) and 0 < len(given) <= 128:
        return given
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    if headers is not None:
        header = headers.get("mcp-session-id")
        if header:
            return str(header)[:128]
    return fallback


def build_server(gateway: Gateway, fallback: str) -> Server[Any]:
    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return await gateway.list_tools()

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        meta = _meta(params)
        key = session_key(ctx, meta, fallback)
        client = ""
        with contextlib.suppress(Exception):
            info = ctx.session.client_params
            client = info.client_info.name if info is not None else ""
        try:
            session = await gateway.session_for(key, client or "mcp client")
        except Exception as exc:  # noqa: BLE001 - the client is told, in the result
            logger.warning("could not start a run for session %s: %s", key, exc)
            return types.CallToolResult(
                content=[
                    types.TextContent(type="text", text=f"Holdpoint refused the session: {exc}")
                ],
                is_error=True,
            )
        token = meta.get("progress_token", meta.get("progressToken"))
        progress = None
        if token is not None:

            async def progress(done: float, message: str) -> None:
                await ctx.session.send_progress_notification(
                    token, done, None, message, related_request_id=str(ctx.request_id)
                )

        client_key = meta.get(KEY_META)
        return await gateway.call_tool(
            session,
            params.name,
            dict(params.arguments or {}),
            client_key=client_key if isinstance(client_key, str) else "",
            progress=progress,
        )

    return Server(
        "holdpoint-mcp-gateway",
        instructions=(
            "Tools of other MCP servers, under Holdpoint: some calls wait for a person's "
            "approval; a result marked holdpoint/status=pending says where."
        ),
        on_list_tools=on_list_tools,
        on_call_tool=on_call_tool,
    )


async def serve(config_path: str, http: str, stdio: bool) -> None:
    gateway = Gateway(load(config_path))
    await gateway.start()
    fallback = new_session_key()
    server = build_server(gateway, fallback)
    try:
        if stdio:
            from mcp.server.stdio import stdio_server

            # SIGTERM (the client's, 2 s after it closes stdin) unwinds through the
            # finally blocks: the session ends and the worker hands its attempts back.
            main = asyncio.current_task()
            if main is not None:
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
            try:
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())
            finally:
                # The client closed stdin (it gives 2 s before SIGTERM): end the run now.
                gateway.end_session(fallback)
        else:
            import uvicorn

            host, _, port = http.rpartition(":")
            app = server.streamable_http_app(host=host or "127.0.0.1")
            uv = uvicorn.Server(
                uvicorn.Config(app, host=host or "127.0.0.1", port=int(port), log_level="warning")
            )
            print(f"holdpoint-mcp-gateway: http://{host}:{port}/mcp", flush=True)
            await uv.serve()
    finally:
        await gateway.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="holdpoint-mcp-gateway", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", required=True, help="the gateway's TOML file")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--http", help="host:port to serve Streamable HTTP on (path /mcp)")
    where.add_argument("--stdio", action="store_true", help="serve one session on stdin/stdout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        asyncio.run(serve(args.config, args.http or "", args.stdio))
    except ConfigError as exc:
        parser.exit(2, f"holdpoint-mcp-gateway: {exc}\n")
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass  # stopped by a signal, after the session's run was settled


if __name__ == "__main__":
    main()
