"""Slack: approvals and questions posted to a group's channel, decided with their buttons.

**What goes out.** A request whose policy (or permission) lets a group with a channel in
``HOLDPOINT_SLACK_CHANNELS`` decide it is owed one Slack message per such group: a
``Notification`` row of channel ``slack`` written with the request
(``runs/services/notifications.py``), posted by the sweep like every message
(``ledger/notifications.py``). The message carries the card: what is asked or what will
happen, the target, whether it can be undone, the time left, the approvals so far, and
buttons (Approve, Deny, Send back, Edit for an approval; the choices of a simple question,
or Answer for a form). It is recorded (``SlackMessage``: channel, ``ts``, the version of
the request it shows).

**Kept up to date, wherever it is decided.** ``slack_sync`` compares each live message's
version with its request's and rewrites it (``chat.update``) when they differ: an approval
given, an edit, a decision on the dashboard, the API, Slack or an e-mail link, an expiry
or a cancel. A message that shows the end has no buttons left and is ``final``. The sweep
runs it, and the Slack endpoint runs it at once after a click (``api/slack.py``).

**Exactly once.** ``chat.postMessage`` takes no idempotency key, so each message carries
the row's key in its metadata. A row whose sender died mid-send is in doubt; before
posting it again the sender looks for a message with that key in the channel
(``conversations.history``) and records that one instead.

**One client.** Every call (``chat.postMessage``, ``chat.update``, ``chat.postEphemeral``,
``views.open``, ``users.info``, ``conversations.history``) goes through the outbound
guard (``ledger/outbound.py``) to ``HOLDPOINT_SLACK_API_URL`` with the bot token; a 429 or
an error is a retry with the outbox's backoff. Agent text is escaped for Slack's
``mrkdwn`` (``slack_text``) and cut to Slack's limits.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from django.conf import settings
from django.utils import timezone

from ledger import outbound
from ledger.notifications import (
    MAX_ATTEMPTS,
    public_url,
    slack_text,
    time_left,
    what_is_asked,
)
from ledger.tools import ActionFailed, OutcomeUnknown
from runs.approvals import approvals_so_far, editable_of, policy_of
from runs.models import InputRequest, Notification, SlackMessage
from runs.states import RequestKind, RequestStatus

logger = logging.getLogger(__name__)

METADATA_TYPE = "holdpoint_request"
# Slack's limits (Block Kit reference): a section's text, a button's text and value.
MAX_TEXT = 2900
MAX_BUTTON = 70
MAX_VALUE = 1900
MAX_CHOICES = 5  # buttons for a question's choices; more take the Answer form
SYNC_BATCH = 50


def obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (Slack's payloads and schemas
    are read without trusting their shape)."""
    return value if isinstance(value, dict) else {}


def enabled() -> bool:
    return bool(
        settings.HOLDPOINT_SLACK_BOT_TOKEN
        and settings.HOLDPOINT_SLACK_SIGNING_SECRET
        and settings.HOLDPOINT_SLACK_CHANNELS
    )


# --- The Web API, through the outbound guard --------------------------------------------------


def api(method: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Call a Web API method; its answer when Slack says ``ok``, else ``ActionFailed``."""
    reply = outbound.send(
        "POST",
        settings.HOLDPOINT_SLACK_API_URL + method,
        headers={
            "Content-Type": "application/json; charset=utf-8",
            "Authorization": f"Bearer {settings.HOLDPOINT_SLACK_BOT_TOKEN}",
        },
        body=json.dumps(payload, ensure_ascii=False).encode(),
        timeout=float(settings.HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS),
    )
    if reply.status == 429:
        raise ActionFailed(
            f"Slack is rate limiting {method} (Retry-After {reply.headers.get('retry-after', '?')})."
        )
    if not 200 <= reply.status < 300:
        raise ActionFailed(f"Slack answered {reply.status} to {method}.")
    try:
        data = json.loads(reply.body)
    except ValueError:
        raise ActionFailed(f"Slack's answer to {method} is not JSON.") from None
    if not isinstance(data, dict) or not data.get("ok"):
        error = data.get("error") if isinstance(data, dict) else None
        raise ActionFailed(f"Slack refused {method}: {error or 'no reason given'}.")
    return data


# --- What a message shows -------------------------------------------------------------------


def version_of(request: InputRequest) -> str:
    """What a message must show again when it changes: the state, the edit round, the
    number of decisions."""
    return f"{request.status}.{request.edit_round}.{request.decisions}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain(text: Any, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": _cut(" ".join(str(text).split()) or "—", limit)}


def _md(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": _cut(text, MAX_TEXT)}


def request_url(request: InputRequest) -> str:
    return f"{public_url()}/runs/{request.run_id}/#request-{request.id}"


def _button(text: str, action: str, value: dict[str, Any], style: str = "") -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "text": _plain(text, MAX_BUTTON),
        "action_id": action,
        "value": _cut(json.dumps(value, ensure_ascii=False), MAX_VALUE),
    }
    if style:
        button["style"] = style
    return button


def _reversibility(request: InputRequest) -> str:
    action = request.action if isinstance(request.action, dict) else {}
    return {
        "irreversible": ":warning: *Cannot be undone*",
        "compensable": "Can be undone by a compensating action",
        "reversible": "Can be undone",
    }.get(
        str(action.get("reversibility") or ""),
        ":warning: Reversibility not stated: treat it as permanent",
    )


def _when(moment: dt.datetime) -> str:
    stamp = int(moment.timestamp())
    fallback = moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{stamp}^{{date_short_pretty}} {{time}}|{fallback}>"


def _approvals_line(request: InputRequest) -> str:
    policy = policy_of(request.policy)
    given = approvals_so_far(request)
    names = ", ".join(
        slack_text(v.user.get_username() if v.user is not None else v.actor) for v in given
    )
    line = f"{len(given)} of {policy['required']} approvals"
    return f"{line}: {names}" if names else line


def simple_choices(request: InputRequest) -> tuple[str, list[Any]] | None:
    """A question answered by one click: an object with one required property that is a
    yes/no or one of at most ``MAX_CHOICES`` strings; (its name, its choices)."""
    schema = request.accepted_schema if isinstance(request.accepted_schema, dict) else {}
    props = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(props, dict) or len(props) != 1:
        return None
    [(name, field)] = props.items()
    if not isinstance(field, dict) or name not in (schema.get("required") or []):
        return None
    if field.get("type") == "boolean":
        return name, [True, False]
    choices = field.get("enum")
    if (
        field.get("type") == "string"
        and isinstance(choices, list)
        and 0 < len(choices) <= MAX_CHOICES
        and all(isinstance(c, str) for c in choices)
    ):
        return name, list(choices)
    return None


def _outcome_line(request: InputRequest) -> str:
    who = slack_text(request.answered_by.get_username()) if request.answered_by else "someone"
    if request.status == RequestStatus.ANSWERED:
        decision = request.answer.get("decision") if isinstance(request.answer, dict) else None
        verb = {
            "approve": "Approved",
            "deny": "Denied",
            "respond": "Sent back",
        }.get(str(decision), "Answered")
        when = _when(request.answered_at) if request.answered_at else ""
        return f"*{verb}* by {who} {when}".strip()
    if request.status in (RequestStatus.EXPIRED, RequestStatus.PENDING):  # pending: past its time
        return f"*Expired* {_when(request.expires_at)}: nobody decided in time."
    return f"*Closed*: {slack_text(request.closed_reason or 'the run moved on.')}"


def message_blocks(request: InputRequest, now: dt.datetime) -> tuple[str, list[dict[str, Any]]]:
    """The message about ``request`` as it is now: its fallback text and its blocks."""
    run = request.run
    asked = what_is_asked(request)
    is_approval = request.kind == RequestKind.AUTH_REQUIRED
    label = "Approval" if is_approval else "Question"
    text = slack_text(f"{label}: {asked} ({run.label})")
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": _md(f"*{label}* · {slack_text(asked)}")},
        {
            "type": "context",
            "elements": [
                _md(f"{slack_text(run.label)} · {slack_text(run.agent)} · `{request.id}`")
            ],
        },
    ]
    version = {"r": request.id, "v": request.edit_round}
    if is_approval:
        action = request.action if isinstance(request.action, dict) else {}
        facts = [
            f"*Target*\n{slack_text(action.get('target') or '—')}",
            f"*Undo*\n{_reversibility(request)}",
        ]
        blocks.append({"type": "section", "fields": [_md(f) for f in facts]})
        if request.reason:
            blocks.append({"type": "section", "text": _md(f"*Why*: {slack_text(request.reason)}")})
    elif request.prompt and asked != " ".join(str(request.prompt).split()):
        blocks.append({"type": "section", "text": _md(slack_text(request.prompt))})
    pending = request.status == RequestStatus.PENDING and request.expires_at > now
    if pending:
        left = f"*Time left*: {time_left(request, now)} (until {_when(request.expires_at)})"
        if is_approval:
            left += f"\n{_approvals_line(request)}"
        blocks.append({"type": "section", "text": _md(left)})
        buttons: list[dict[str, Any]] = []
        if is_approval:
            approve = _button("Approve", "hp:approve", version, "primary")
            if "Cannot be undone" in _reversibility(request) or "not stated" in _reversibility(
                request
            ):
                approve["confirm"] = {
                    "title": _plain("Approve?", 100),
                    "text": _md(f"{slack_text(asked)}. This cannot be undone."),
                    "confirm": _plain("Approve", 30),
                    "deny": _plain("Back", 30),
                }
            buttons += [
                approve,
                _button("Deny…", "hp:deny", version, "danger"),
                _button("Send back…", "hp:respond", version),
            ]
            if editable_of(request.action) is not None:
                buttons.append(_button("Edit and approve…", "hp:edit", version))
        else:
            simple = simple_choices(request)
            if simple is not None:
                _name, choices = simple
                for choice in choices:
                    shown = (
                        {True: "Yes", False: "No"}.get(choice, choice)
                        if isinstance(choice, bool)
                        else choice
                    )
                    buttons.append(_button(str(shown), "hp:choose", {**version, "c": choice}))
            else:
                buttons.append(_button("Answer…", "hp:form", version, "primary"))
        buttons.append(
            {
                "type": "button",
                "text": _plain("Open in Holdpoint", MAX_BUTTON),
                "action_id": "hp:open",
                "url": request_url(request),
            }
        )
        blocks.append({"type": "actions", "block_id": f"hp:{request.id}", "elements": buttons})
    else:
        if is_approval:
            blocks.append({"type": "section", "text": _md(_approvals_line(request))})
        blocks.append({"type": "section", "text": _md(_outcome_line(request))})
        blocks.append(
            {
                "type": "context",
                "elements": [_md(f"<{request_url(request)}|Open in Holdpoint>")],
            }
        )
    return text, blocks


# --- Posting (the outbox's sender calls this) ------------------------------------------------


def _already_posted(channel: str, key: str, since: dt.datetime) -> str | None:
    """The ``ts`` of a message with ``key`` posted to ``channel`` since ``since`` (a send in
    doubt that did reach Slack), or None."""
    found = api(
        "conversations.history",
        {
            "channel": channel,
            "oldest": f"{since.timestamp() - 60:.6f}",
            "include_all_metadata": True,
            "limit": 200,
        },
    )
    for message in found.get("messages") or []:
        meta = message.get("metadata") if isinstance(message, dict) else None
        if (
            isinstance(meta, dict)
            and meta.get("event_type") == METADATA_TYPE
            and (meta.get("event_payload") or {}).get("key") == key
        ):
            return str(message.get("ts"))
    return None


def post_request(row: Notification, now: dt.datetime) -> None:
    """Post the message a ``slack`` row owes (once: see the module's docstring)."""
    channel = settings.HOLDPOINT_SLACK_CHANNELS.get(row.group)
    if not channel:
        raise ActionFailed(f"No Slack channel is configured for the group {row.group!r}.")
    request = row.request
    if SlackMessage.objects.filter(key=row.key).exists():
        return  # posted and recorded by an earlier try
    ts = _already_posted(channel, row.key, row.created_at) if row.attempts > 1 else None
    if ts is None:
        text, blocks = message_blocks(request, now)
        answer = api(
            "chat.postMessage",
            {
                "channel": channel,
                "text": text,
                "blocks": blocks,
                "unfurl_links": False,
                "metadata": {"event_type": METADATA_TYPE, "event_payload": {"key": row.key}},
            },
        )
        ts, channel = str(answer["ts"]), str(answer.get("channel") or channel)
    SlackMessage.objects.get_or_create(
        key=row.key,
        defaults={
            "request": request,
            "channel": channel,
            "ts": ts,
            "shown": version_of(request),
        },
    )


# --- Keeping every message up to date --------------------------------------------------------


def slack_sync(*, request_id: str | None = None, limit: int = SYNC_BATCH) -> int:
    """Rewrite the live messages whose request changed since they were posted or last
    rewritten (all, or those of ``request_id``); return how many were rewritten."""
    if not settings.HOLDPOINT_SLACK_BOT_TOKEN:
        return 0
    now = timezone.now()
    messages = SlackMessage.objects.filter(final=False).select_related(
        "request", "request__run", "request__answered_by"
    )
    if request_id is not None:
        messages = messages.filter(request_id=request_id)
    done = 0
    for message in messages.order_by("updated_at", "id")[:limit]:
        request = message.request
        expired = request.status == RequestStatus.PENDING and request.expires_at <= now
        version = version_of(request) + (".late" if expired else "")
        if version == message.shown:
            continue
        # No lock is held over the call to Slack: two syncs at once (a sweep and a click)
        # may both send the same rewrite, which shows the same; the row records it once.
        text, blocks = message_blocks(request, now)
        try:
            api(
                "chat.update",
                {"channel": message.channel, "ts": message.ts, "text": text, "blocks": blocks},
            )
        except (ActionFailed, OutcomeUnknown) as exc:
            logger.warning("slack message %s: %s", message.key, exc)
            # Tried again at the next sweeps; after the outbox's number of tries (a message
            # deleted in Slack, a channel the app left) it is given up, with the reason.
            SlackMessage.objects.filter(pk=message.pk).update(
                attempts=message.attempts + 1,
                last_error=str(exc)[:2000],
                final=message.attempts + 1 >= MAX_ATTEMPTS,
            )
            continue
        final = request.status != RequestStatus.PENDING or expired
        SlackMessage.objects.filter(pk=message.pk, shown=message.shown).update(
            shown=version, final=final, last_error="", updated_at=timezone.now()
        )
        done += 1
    return done


def say_privately(channel: str, slack_user: str, text: str) -> None:
    """An ephemeral message: only ``slack_user`` sees it (a refusal, a confirmation)."""
    api(
        "chat.postEphemeral", {"channel": channel, "user": slack_user, "text": _cut(text, MAX_TEXT)}
    )


# --- Forms in a modal (Deny, Send back, Edit, Answer) ----------------------------------------

MAX_FIELDS = 20
COMMENT_BLOCK = "hp:comment"


class FormUnsupported(Exception):
    """A schema a modal cannot show faithfully: the person answers on the dashboard."""


def _field_element(name: str, field: dict[str, Any], initial: Any) -> dict[str, Any]:
    kind = field.get("type")
    action = f"hp:f:{name}"
    enum = field.get("enum")
    if kind == "string" and isinstance(enum, list) and 0 < len(enum) <= 100:
        options = [
            {"text": _plain(str(v), 75), "value": json.dumps(v, ensure_ascii=False)[:150]}
            for v in enum
        ]
        element: dict[str, Any] = {"type": "static_select", "action_id": action, "options": options}
        if initial in enum:
            element["initial_option"] = options[enum.index(initial)]
        return element
    if kind == "string" and enum is None:
        limit = int(field.get("maxLength") or 3000)
        element = {
            "type": "plain_text_input",
            "action_id": action,
            "multiline": limit > 150,
            "max_length": min(limit, 3000),
        }
        if isinstance(initial, str) and initial:
            element["initial_value"] = initial[:3000]
        return element
    if kind in ("integer", "number"):
        element = {
            "type": "number_input",
            "action_id": action,
            "is_decimal_allowed": kind == "number",
        }
        for key, slack_key in (("minimum", "min_value"), ("maximum", "max_value")):
            if isinstance(field.get(key), int | float) and not isinstance(field.get(key), bool):
                element[slack_key] = str(field[key])
        if isinstance(initial, int | float) and not isinstance(initial, bool):
            element["initial_value"] = str(initial)
        return element
    if kind == "boolean":
        options = [
            {"text": _plain("Yes", 20), "value": "true"},
            {"text": _plain("No", 20), "value": "false"},
        ]
        element = {"type": "static_select", "action_id": action, "options": options}
        if isinstance(initial, bool):
            element["initial_option"] = options[0 if initial else 1]
        return element
    items = obj(field.get("items"))
    if kind == "array" and isinstance(items.get("enum"), list) and 0 < len(items["enum"]) <= 100:
        options = [
            {"text": _plain(str(v), 75), "value": json.dumps(v, ensure_ascii=False)[:150]}
            for v in items["enum"]
        ]
        element = {"type": "multi_static_select", "action_id": action, "options": options}
        chosen = (
            [options[items["enum"].index(v)] for v in initial or [] if v in items["enum"]]
            if isinstance(initial, list)
            else []
        )
        if chosen:
            element["initial_options"] = chosen
        return element
    if kind == "array" and items.get("type") == "string" and "enum" not in items:
        element = {
            "type": "plain_text_input",
            "action_id": action,
            "multiline": True,
            "max_length": 3000,
        }
        if isinstance(initial, list) and initial:
            element["initial_value"] = "\n".join(str(v) for v in initial)[:3000]
        return element
    raise FormUnsupported(f"{name}: {kind}")


def form_blocks(schema: Any, initial: Any = None) -> list[dict[str, Any]]:
    """Input blocks for an object schema's properties (one each, ``block_id`` = the
    property's name), or ``FormUnsupported``."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise FormUnsupported("not an object")
    props = schema.get("properties")
    if not isinstance(props, dict) or not 0 < len(props) <= MAX_FIELDS:
        raise FormUnsupported("no properties, or too many")
    required = set(schema.get("required") or [])
    values = initial if isinstance(initial, dict) else {}
    blocks = []
    for name, field in props.items():
        if not isinstance(field, dict) or not str(name) or len(str(name)) > 200:
            raise FormUnsupported(str(name))
        block: dict[str, Any] = {
            "type": "input",
            "block_id": str(name),
            "label": _plain(field.get("title") or str(name).replace("_", " ").capitalize(), 1900),
            "element": _field_element(str(name), field, values.get(name)),
            "optional": name not in required,
        }
        if field.get("description"):
            block["hint"] = _plain(field["description"], 1900)
        if field.get("type") == "array" and block["element"]["type"] == "plain_text_input":
            block["hint"] = _plain("One per line.", 100)
        blocks.append(block)
    return blocks


def form_value(schema: dict[str, Any], state: Any) -> dict[str, Any]:
    """The object a submitted modal carries (its ``view.state.values``), typed by the
    schema; what the person left empty is left out. The service validates it."""
    values = state if isinstance(state, dict) else {}
    out: dict[str, Any] = {}
    for name, field in (schema.get("properties") or {}).items():
        entry = (values.get(str(name)) or {}).get(f"hp:f:{name}") or {}
        if not isinstance(entry, dict):
            continue
        kind = entry.get("type")
        if kind == "plain_text_input":
            text = entry.get("value")
            if not isinstance(text, str) or not text.strip():
                continue
            if field.get("type") == "array":
                out[name] = [line.strip() for line in text.splitlines() if line.strip()]
            else:
                out[name] = text
        elif kind == "number_input":
            raw = entry.get("value")
            if raw in (None, ""):
                continue
            try:
                number = float(raw)
            except (TypeError, ValueError):
                out[name] = raw  # the schema check says what is wrong
                continue
            out[name] = (
                int(number) if field.get("type") == "integer" and number.is_integer() else number
            )
        elif kind == "static_select":
            option = entry.get("selected_option")
            if isinstance(option, dict):
                out[name] = _option_value(option)
        elif kind == "multi_static_select":
            options = entry.get("selected_options")
            if isinstance(options, list) and options:
                out[name] = [_option_value(o) for o in options if isinstance(o, dict)]
    return out


def _option_value(option: dict[str, Any]) -> Any:
    try:
        return json.loads(str(option.get("value")))
    except ValueError:
        return option.get("value")


def comment_block(*, required: bool, label: str) -> dict[str, Any]:
    return {
        "type": "input",
        "block_id": COMMENT_BLOCK,
        "label": _plain(label, 100),
        "element": {
            "type": "plain_text_input",
            "action_id": "hp:comment",
            "multiline": True,
            "max_length": 2000,
        },
        "optional": not required,
    }


def comment_of(state: Any) -> str:
    entry = ((state or {}).get(COMMENT_BLOCK) or {}).get("hp:comment") or {}
    value = entry.get("value") if isinstance(entry, dict) else None
    return value.strip() if isinstance(value, str) else ""


def open_modal(
    trigger: str,
    *,
    title: str,
    submit: str,
    callback: str,
    meta: dict[str, Any],
    blocks: list[dict[str, Any]],
) -> None:
    """Open a modal for the person whose click gave ``trigger`` (``views.open``)."""
    api(
        "views.open",
        {
            "trigger_id": trigger,
            "view": {
                "type": "modal",
                "callback_id": callback,
                "title": _plain(title, 24),
                "submit": _plain(submit, 24),
                "close": _plain("Cancel", 24),
                "private_metadata": json.dumps(meta)[:3000],
                "blocks": blocks,
            },
        },
    )
