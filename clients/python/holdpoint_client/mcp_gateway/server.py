"""The gateway's MCP face: the official SDK's low-level ``Server``, over Streamable HTTP or
stdio, and the command ``holdpoint-mcp-gateway``.

    holdpoint-mcp-gateway --config gateway.toml --http 127.0.0.1:8770   # …/mcp
    holdpoint-mcp-gateway --config gateway.toml --stdio                 # one session
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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


def bearer(ctx: Any) -> str:
    """The API token a Streamable HTTP client presented (the middleware checked it)."""
    headers = getattr(getattr(ctx, "request", None), "headers", None)
    value = headers.get("authorization", "") if headers is not None else ""
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class RequireToken:
    """ASGI middleware: every Streamable HTTP request carries ``Authorization: Bearer
    <a Holdpoint API token>`` that Holdpoint accepts, or is answered 401 and goes no
    further. The token is the person the session's run is started as."""

    def __init__(self, app: Any, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not await self.gateway.verify(token.strip()):
            body = json.dumps(
                {
                    "type": "about:blank",
                    "title": "Authentication required",
                    "status": 401,
                    "code": "not_authenticated",
                    "detail": "Send Authorization: Bearer <your Holdpoint API token>.",
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/problem+json"),
                        (b"www-authenticate", b'Bearer realm="holdpoint-mcp-gateway"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def build_server(gateway: Gateway, fallback: str, stdio_token: str = "") -> Server[Any]:
    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return await gateway.list_tools()

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        meta = _meta(params)
        key = session_key(ctx, meta, fallback)
        client = ""
        with contextlib.suppress(Exception):
            info = ctx.session.client_params
            client = info.client_info.name if info is not None else ""
        token = stdio_token or bearer(ctx)
        if not gateway.allow(token):
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="Too many calls: wait a minute.")],
                is_error=True,
                _meta={"holdpoint/status": "throttled"},
            )
        try:
            session = await gateway.session_for(key, client or "mcp client", token)
        except Exception as exc:  # noqa: BLE001 - the client is told, in the result
            logger.warning("could not start a run for session %s: %s", key, exc)
            return types.CallToolResult(
                content=[
                    types.TextContent(type="text", text=f"Holdpoint refused the session: {exc}")
                ],
                is_error=True,
                _meta={"holdpoint/status": "refused"},
            )
        progress_token = meta.get("progress_token", meta.get("progressToken"))
        progress = None
        if progress_token is not None:

            async def progress(done: float, message: str) -> None:
                await ctx.session.send_progress_notification(
                    progress_token, done, None, message, related_request_id=str(ctx.request_id)
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
    config = load(config_path)
    if stdio and not config.api_token:
        raise ConfigError(
            "--stdio needs HOLDPOINT_API_TOKEN in the environment: the API token of the "
            "person whose session it is (over HTTP each client sends its own)"
        )
    gateway = Gateway(config)
    await gateway.start()
    fallback = new_session_key()
    server = build_server(gateway, fallback, config.api_token if stdio else "")
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
                gateway.end_session(fallback, config.api_token)
        else:
            import uvicorn

            host, _, port = http.rpartition(":")
            app = RequireToken(server.streamable_http_app(host=host or "127.0.0.1"), gateway)
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
