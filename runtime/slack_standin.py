"""A local stand-in for Slack, for the demo (``make run SLACK=stub``) and the tests.

Slack cannot be reached from every machine Holdpoint is built on, so this plays both of
Slack's parts, and nothing more:

- **The Web API** Holdpoint calls (``HOLDPOINT_SLACK_API_URL`` = ``http://HOST:PORT/api/``):
  ``chat.postMessage``, ``chat.update``, ``chat.postEphemeral``, ``views.open``,
  ``conversations.history`` and ``users.info``, answering as Slack documents them
  (``{"ok": true, …}``, or ``{"ok": false, "error": "…"}``) and refusing a call without the
  bot token (``invalid_auth``). Every call is recorded (``calls``), and a test can make the
  next call of a method fail (``fail_next``).
- **The person in Slack**: a page at ``/`` shows each channel's messages as Block Kit
  describes them (sections, buttons, links), the ephemeral messages of the person chosen,
  and the modals Holdpoint opened for them. A button or a modal's submit sends Holdpoint
  the interactivity payload Slack would send, signed with the app's signing secret
  (``slack_sdk``), to ``HOLDPOINT/api/slack/interactions``. ``click`` and ``submit`` do the
  same for tests.

It keeps everything in memory and binds to 127.0.0.1 by default:
``python -m runtime.slack_standin --port 8125 --holdpoint http://127.0.0.1:8000``.
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

TEAM = "T0HOLDPOINT"
TOKEN = "xoxb-standin-token"
SIGNING_SECRET = "standin-signing-secret-0123456789abcdef"
# The demo's Slack people: their ids and the addresses Slack confirmed for them.
DEMO_USERS = {
    "U0APPROVER": "approver@example.com",
    "U0REVIEWER": "reviewer@example.com",
    "U0OPERATOR": "operator@example.com",
}


@dataclass
class Workspace:
    """Slack's state: messages by channel, ephemerals and open views by user, the calls."""

    token: str = TOKEN
    signing_secret: str = SIGNING_SECRET
    holdpoint: str = "http://127.0.0.1:8000"
    users: dict[str, str] = field(default_factory=lambda: dict(DEMO_USERS))
    # Users whose address Slack has not confirmed (``users.info`` says so).
    unconfirmed: set[str] = field(default_factory=set)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    ephemeral: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    triggers: dict[str, str] = field(default_factory=dict)  # trigger_id -> user
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)
    # How a signed payload reaches Holdpoint: HTTP to ``holdpoint`` unless a test hands in
    # its own (body, headers) -> (status, body).
    transport: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _numbers: Any = field(default_factory=lambda: itertools.count(1))

    # --- The Web API -------------------------------------------------------------------------

    def call(self, method: str, token: str, payload: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.calls.append((method, payload))
            if token != self.token:
                return {"ok": False, "error": "invalid_auth"}
            queued = self.failures.get(method)
            if queued:
                return {"ok": False, "error": queued.pop(0)}
            handler = getattr(self, "_" + method.replace(".", "_"), None)
            if handler is None:
                return {"ok": False, "error": "unknown_method"}
            return handler(payload)

    def fail_next(self, method: str, error: str = "internal_error") -> None:
        with self.lock:
            self.failures.setdefault(method, []).append(error)

    def _ts(self) -> str:
        return f"{time.time():.0f}.{next(self._numbers):06d}"

    def _chat_postMessage(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = p.get("channel")
        if not isinstance(channel, str) or not channel:
            return {"ok": False, "error": "channel_not_found"}
        message = {
            "ts": self._ts(),
            "text": p.get("text", ""),
            "blocks": p.get("blocks") or [],
            "metadata": p.get("metadata"),
            "edited": 0,
        }
        self.messages.setdefault(channel, []).append(message)
        return {"ok": True, "channel": channel, "ts": message["ts"], "message": message}

    def _chat_update(self, p: dict[str, Any]) -> dict[str, Any]:
        message = self.find(str(p.get("channel")), str(p.get("ts")))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        message.update(text=p.get("text", ""), blocks=p.get("blocks") or [])
        message["edited"] += 1
        return {"ok": True, "channel": p.get("channel"), "ts": p.get("ts")}

    def _chat_postEphemeral(self, p: dict[str, Any]) -> dict[str, Any]:
        user = str(p.get("user"))
        if not (user.startswith("U") and user.isalnum()):
            return {"ok": False, "error": "user_not_in_channel"}
        self.ephemeral.setdefault(user, []).append(
            {"channel": p.get("channel"), "text": p.get("text", ""), "ts": self._ts()}
        )
        return {"ok": True, "message_ts": self._ts()}

    def _views_open(self, p: dict[str, Any]) -> dict[str, Any]:
        user = self.triggers.pop(str(p.get("trigger_id")), None)
        if user is None:
            return {"ok": False, "error": "invalid_trigger_id"}
        view = dict(p.get("view") or {})
        view_id = f"V{next(self._numbers):08d}"
        view.update(id=view_id, hash=f"h{next(self._numbers)}", user=user)
        self.views[view_id] = view
        return {"ok": True, "view": view}

    def _conversations_history(self, p: dict[str, Any]) -> dict[str, Any]:
        oldest = float(p.get("oldest") or 0)
        found = [
            m for m in self.messages.get(str(p.get("channel")), []) if float(m["ts"]) >= oldest
        ]
        return {"ok": True, "messages": list(reversed(found))}

    def _users_info(self, p: dict[str, Any]) -> dict[str, Any]:
        user = str(p.get("user"))
        if user not in self.users:
            return {"ok": False, "error": "user_not_found"}
        return {
            "ok": True,
            "user": {
                "id": user,
                "team_id": TEAM,
                "is_email_confirmed": user not in self.unconfirmed,
                "profile": {"email": self.users[user]},
            },
        }

    def find(self, channel: str, ts: str) -> dict[str, Any] | None:
        return next((m for m in self.messages.get(channel, []) if m["ts"] == ts), None)

    # --- The person in Slack -----------------------------------------------------------------

    def click(self, user: str, channel: str, ts: str, action_id: str) -> tuple[int, bytes]:
        """Press the button ``action_id`` of a message as ``user``: Slack's block_actions."""
        message = self.find(channel, ts)
        if message is None:
            raise LookupError(f"no message {ts} in {channel}")
        button = next(
            (
                e
                for b in message["blocks"]
                if b.get("type") == "actions"
                for e in b.get("elements", [])
                if e.get("action_id") == action_id
            ),
            None,
        )
        if button is None:
            raise LookupError(f"the message has no button {action_id}")
        trigger = f"trg{next(self._numbers)}"
        with self.lock:
            self.triggers[trigger] = user
        payload = {
            "type": "block_actions",
            "team": {"id": TEAM},
            "user": {"id": user, "team_id": TEAM},
            "channel": {"id": channel},
            "container": {"type": "message", "message_ts": ts, "channel_id": channel},
            "trigger_id": trigger,
            "actions": [
                {
                    "action_id": action_id,
                    "block_id": "",
                    "value": button.get("value"),
                    "type": "button",
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }
        return self.send(payload)

    def submit(self, view_id: str, values: dict[str, Any]) -> tuple[int, bytes]:
        """Submit an open modal with ``values`` (block id -> the element's state)."""
        view = self.views[view_id]
        state = {
            block: {f"hp:f:{block}" if block != "hp:comment" else "hp:comment": value}
            for block, value in values.items()
        }
        payload = {
            "type": "view_submission",
            "team": {"id": TEAM},
            "user": {"id": view["user"], "team_id": TEAM},
            "view": {
                "id": view_id,
                "hash": view["hash"],
                "callback_id": view.get("callback_id"),
                "private_metadata": view.get("private_metadata", ""),
                "state": {"values": state},
            },
        }
        status, body = self.send(payload)
        if status == 200 and not body:
            self.views.pop(view_id, None)  # closed, as Slack closes it
        return status, body

    def signed(self, payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        from slack_sdk.signature import SignatureVerifier

        body = urlencode({"payload": json.dumps(payload)}).encode()
        stamp = str(int(time.time()))
        signature = SignatureVerifier(self.signing_secret).generate_signature(
            timestamp=stamp, body=body
        )
        return body, {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": signature or "",
        }

    def send(self, payload: dict[str, Any]) -> tuple[int, bytes]:
        body, headers = self.signed(payload)
        if self.transport is not None:
            return self.transport(body, headers)
        url = self.holdpoint.rstrip("/") + "/api/slack/interactions"
        if not url.startswith(("http://", "https://")):
            raise ValueError("holdpoint must be an http(s) URL")
        request = urllib.request.Request(url, data=body, headers=headers)  # noqa: S310 - checked
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310 - our URL
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()


# --- The page --------------------------------------------------------------------------------


def _text(block_text: Any) -> str:
    """mrkdwn as Slack shows it, roughly: a date token as its fallback, a link as a link,
    ``&lt;`` ``&gt;`` ``&amp;`` as the characters they stand for (escaped again for HTML)."""
    text = block_text.get("text", "") if isinstance(block_text, dict) else str(block_text)
    out, last = [], 0
    for match in re.finditer(r"<(!date\^[^|>]*\|([^>]*)|(https?://[^|>]+)\|([^>]*))>", str(text)):
        out.append(_plain_html(str(text)[last : match.start()]))
        if match.group(2) is not None:
            out.append(_plain_html(match.group(2)))
        else:
            out.append(f'<a href="{html.escape(match.group(3))}">{_plain_html(match.group(4))}</a>')
        last = match.end()
    out.append(_plain_html(str(text)[last:]))
    return "".join(out).replace("\n", "<br>")


def _plain_html(text: str) -> str:
    unescaped = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return html.escape(unescaped)


def render_page(space: Workspace, user: str) -> str:
    rows = []
    for channel, messages in sorted(space.messages.items()):
        rows.append(f"<h2>#{html.escape(channel)}</h2>")
        for m in messages:
            parts = []
            for b in m["blocks"]:
                if b.get("type") in ("section", "context"):
                    texts = [
                        b.get("text"),
                        *list(b.get("fields") or []),
                        *list(b.get("elements") or []),
                    ]
                    parts.append("<p>" + " · ".join(_text(t) for t in texts if t) + "</p>")
                elif b.get("type") == "actions":
                    buttons = []
                    for e in b.get("elements", []):
                        label = _text(e.get("text"))
                        if e.get("url"):
                            buttons.append(f'<a href="{html.escape(e["url"])}">{label}</a>')
                        else:
                            buttons.append(
                                '<form method="post" action="/click" style="display:inline">'
                                f'<input type="hidden" name="user" value="{html.escape(user)}">'
                                f'<input type="hidden" name="channel" value="{html.escape(channel)}">'
                                f'<input type="hidden" name="ts" value="{html.escape(m["ts"])}">'
                                f'<input type="hidden" name="action" value="{html.escape(e.get("action_id", ""))}">'
                                f"<button>{label}</button></form>"
                            )
                    parts.append("<p>" + " ".join(buttons) + "</p>")
            edited = " <small>(edited)</small>" if m["edited"] else ""
            rows.append(
                f'<div class="msg" data-ts="{html.escape(m["ts"])}">{"".join(parts)}{edited}</div>'
            )
    mine = "".join(f"<li>{_text(e['text'])}</li>" for e in space.ephemeral.get(user, [])[-5:])
    views = []
    for view_id, view in space.views.items():
        if view.get("user") != user:
            continue
        fields = []
        for b in view.get("blocks", []):
            if b.get("type") != "input":
                continue
            el, name = b["element"], html.escape(b["block_id"])
            label = _text(b.get("label"))
            if el["type"] in ("static_select", "multi_static_select"):
                multiple = " multiple" if el["type"] == "multi_static_select" else ""
                options = "".join(
                    f'<option value="{html.escape(o["value"])}">{_text(o["text"])}</option>'
                    for o in el.get("options", [])
                )
                fields.append(
                    f'<label>{label} <select name="{name}"{multiple}>{options}</select></label>'
                )
            else:
                value = html.escape(str(el.get("initial_value", "")))
                fields.append(f'<label>{label} <textarea name="{name}">{value}</textarea></label>')
        views.append(
            f'<form method="post" action="/submit" class="modal"><h3>{_text(view.get("title"))}</h3>'
            f'<input type="hidden" name="view" value="{html.escape(view_id)}">'
            f'<input type="hidden" name="user" value="{html.escape(user)}">'
            + "<br>".join(fields)
            + f"<br><button>{_text(view.get('submit'))}</button></form>"
        )
    people = "".join(
        f'<option value="{u}"{" selected" if u == user else ""}>{u} ({html.escape(e)})</option>'
        for u, e in space.users.items()
    )
    return (
        "<!doctype html><meta charset=utf-8><title>Slack stand-in</title>"
        "<style>body{font-family:sans-serif;max-width:60rem;margin:1rem auto}"
        ".msg{border:1px solid #ccc;border-radius:6px;padding:.5rem;margin:.5rem 0}"
        ".modal{border:2px solid #36c;padding:1rem;margin:1rem 0}label{display:block}</style>"
        "<h1>Slack stand-in</h1><p>Holdpoint's messages as Slack would show them. You are "
        f'<form method="get" style="display:inline"><select name="user" onchange="this.form.submit()">{people}</select></form>'
        " <a href>refresh</a></p>"
        f"{''.join(views)}<h3>Only you can see</h3><ul>{mine}</ul>{''.join(rows)}"
    )


def _state_of(view: dict[str, Any], form: dict[str, list[str]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for b in view.get("blocks", []):
        if b.get("type") != "input":
            continue
        name, el = b["block_id"], b["element"]
        given = form.get(name, [])
        if el["type"] == "static_select":
            option = next((o for o in el["options"] if given and o["value"] == given[0]), None)
            values[name] = {"type": "static_select", "selected_option": option}
        elif el["type"] == "multi_static_select":
            values[name] = {
                "type": "multi_static_select",
                "selected_options": [o for o in el["options"] if o["value"] in given],
            }
        else:
            values[name] = {"type": el["type"], "value": given[0] if given else None}
    return values


def make_handler(space: Workspace) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(
            self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            user = (parse_qs(url.query).get("user") or [next(iter(space.users))])[0]
            page = render_page(space, user).encode()
            self._send(200, page, "text/html; charset=utf-8")

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            raw = self._body()
            if url.path.startswith("/api/"):
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                try:
                    payload = json.loads(raw or b"{}")
                except ValueError:
                    payload = {}
                answer = space.call(url.path.removeprefix("/api/"), token, payload)
                self._send(200, json.dumps(answer).encode(), "application/json")
                return
            form = parse_qs(raw.decode())
            user = (form.get("user") or [""])[0]
            if url.path == "/click":
                space.click(user, form["channel"][0], form["ts"][0], form["action"][0])
            elif url.path == "/submit":
                view_id = form["view"][0]
                view = space.views.get(view_id)
                if view is not None:
                    state = _state_of(view, form)
                    status, body = space.submit(view_id, {k: v for k, v in state.items()})
                    if status == 200 and body:
                        errors = json.loads(body).get("errors", {})
                        space.ephemeral.setdefault(user, []).append(
                            {
                                "text": "Form errors: "
                                + "; ".join(f"{k}: {v}" for k, v in errors.items())
                            }
                        )
            self._send(303, b"", "text/plain", {"Location": f"/?user={user}"})

    return Handler


def serve(space: Workspace, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the stand-in in a daemon thread; its address is ``server.server_address``."""
    server = ThreadingHTTPServer((host, port), make_handler(space))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="slack-standin").start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8125)
    parser.add_argument("--holdpoint", default="http://127.0.0.1:8000")
    opts = parser.parse_args()
    space = Workspace(holdpoint=opts.holdpoint)
    server = ThreadingHTTPServer((opts.host, opts.port), make_handler(space))
    print(f"Slack stand-in on http://{opts.host}:{opts.port}/ (Web API at /api/)")
    server.serve_forever()


if __name__ == "__main__":
    main()
