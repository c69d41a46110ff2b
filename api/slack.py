"""Slack's interactivity endpoint: a click on a message's button, or a modal submitted.

``POST /api/slack/interactions`` (the Slack app's *Interactivity Request URL*). Every
request is checked as Slack signs it before anything else is read (``slack_sdk``'s
``SignatureVerifier``: the signing secret, the timestamp within five minutes); a signature
seen before is refused (a replay), as is anything unsigned, stale or malformed: 401 or 400
``application/problem+json``, nothing done.

A click decides as the Holdpoint person linked to the Slack user (``runs/services/slack.py``)
through the same service as the dashboard (``services.run_resume``: the approval's policy,
the run's lock, the request and checkpoint asked about, the schema), with the version of
the request the message showed (an edit since refuses it), ``via="slack"``, and once per
click (``Idempotency-Key`` ``slack:<action_ts>`` for the person). An unlinked or
unauthorised clicker, or any refusal, gets an ephemeral message only they see, with the
reason; nothing is decided. After a decision every message about the request is rewritten
at once (``ledger.slack.slack_sync``), for everyone.

Slack waits three seconds for the answer: a block action is answered 200 with an empty
body, a modal's submission with ``response_action`` (its errors, or nothing to close it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from slack_sdk.signature import SignatureVerifier

from api.problems import problem_response
from ledger import slack
from ledger.slack import obj
from ledger.tools import ActionFailed, OutcomeUnknown
from runs import services
from runs.approvals import current_value, editable_of
from runs.audit import SLACK
from runs.errors import HoldpointError
from runs.idempotency import StoredResponse, idempotent_call, principal_for_user
from runs.models import InputRequest
from runs.ratelimit import hit, rate_for
from runs.selectors import permission_denied_text, permission_for_request_kind
from runs.services.slack import SlackAccount, link_token, person_by_email, slack_link, slack_person
from runs.states import RequestKind, RequestStatus

logger = logging.getLogger(__name__)

REPLAY_SECONDS = 6 * 60  # longer than the five minutes a signature is accepted
MAX_PAYLOAD = 64 * 1024
PATH = "/api/slack/interactions"
DECISIONS = {"hp:deny": "deny", "hp:respond": "respond"}


def _refuse(code: str, detail: str) -> HttpResponse:
    return problem_response(code, detail, instance=PATH)


@csrf_exempt
def interactions(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        response = _refuse(
            "method_not_allowed", "Slack posts interactions; nothing else is served here."
        )
        response["Allow"] = "POST"
        return response
    if not slack.enabled():
        return _refuse("not_found", "Slack is not configured on this server.")
    body = request.body
    timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
    signature = request.headers.get("X-Slack-Signature", "")
    if not _signed_by_slack(body, timestamp, signature):
        return _refuse(
            "authentication_failed",
            "The request is not signed with this app's signing secret, or its timestamp is "
            "more than five minutes away.",
        )
    if not cache.add(f"hp:slack:sig:{signature}", 1, timeout=REPLAY_SECONDS):
        return _refuse(
            "authentication_failed", "This signed request was received before: a replay."
        )
    payload = _payload(body)
    if payload is None:
        return _refuse(
            "malformed_request", "The body must be form-encoded with one JSON `payload`."
        )
    account = _account(payload)
    if account is None:
        return _refuse("malformed_request", "The payload names no Slack team and user.")
    rate = rate_for("HOLDPOINT_THROTTLE_USER")
    if rate is not None and not hit("slack", f"{account.team_id}:{account.user_id}", rate).allowed:
        return _refuse("throttled", "Too many clicks at once; try again in a minute.")
    kind = payload.get("type")
    try:
        if kind == "block_actions":
            return _block_action(payload, account)
        if kind == "view_submission":
            return _view_submission(payload, account)
    except (ActionFailed, OutcomeUnknown) as exc:
        # Slack itself did not answer us (an ephemeral, a modal): the decision, if any, stands.
        logger.warning("slack call failed while answering a %s: %s", kind, exc)
    return HttpResponse(status=200)


def _signed_by_slack(body: bytes, timestamp: str, signature: str) -> bool:
    """``slack_sdk``'s check (HMAC-SHA256 of ``v0:timestamp:body`` with the signing secret,
    the timestamp within five minutes), for a request that has the headers at all."""
    if not (timestamp.isdigit() and len(timestamp) <= 12 and signature.startswith("v0=")):
        return False
    verifier = SignatureVerifier(settings.HOLDPOINT_SLACK_SIGNING_SECRET)
    try:
        return bool(verifier.is_valid(body=body, timestamp=timestamp, signature=signature))
    except (ValueError, UnicodeDecodeError):
        return False


def _payload(body: bytes) -> dict[str, Any] | None:
    if len(body) > MAX_PAYLOAD:
        return None
    try:
        values = parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=5)
        raw = values.get("payload")
        data = json.loads(raw[0]) if raw and len(raw) == 1 else None
    except (UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _account(payload: dict[str, Any]) -> SlackAccount | None:
    user, team = obj(payload.get("user")), obj(payload.get("team"))
    team_id, user_id = team.get("id") or user.get("team_id"), user.get("id")
    if not all(isinstance(v, str) and 0 < len(v) <= 40 and v.isalnum() for v in (team_id, user_id)):
        return None
    return SlackAccount(team_id=str(team_id), user_id=str(user_id))


def _person(account: SlackAccount, channel: str) -> Any:
    """The person the clicker is, or None after telling them (ephemerally) how to link."""
    person = slack_person(account)
    if person is None and settings.HOLDPOINT_SLACK_LINK_BY_EMAIL:
        user = obj(slack.api("users.info", {"user": account.user_id}).get("user"))
        # Only an address Slack says the person confirmed; anything else links nobody.
        confirmed = user.get("is_email_confirmed") is True
        found = person_by_email(obj(user.get("profile")).get("email")) if confirmed else None
        if found is not None:
            try:
                slack_link(user=found, account=account, how="email")
                person = found
            except HoldpointError:
                person = None
    if person is None and channel:
        url = f"{slack.public_url()}/profile/slack/{link_token(account)}"
        slack.say_privately(
            channel,
            account.user_id,
            "You cannot decide this from Slack yet: your Slack account is not linked to a "
            f"Holdpoint account. <{url}|Link it> (sign in to Holdpoint, then confirm; the "
            "link works for 15 minutes), then click again.",
        )
    return person


def _target(value: Any) -> tuple[str, int] | None:
    try:
        data = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("r"), str)
        or not isinstance(data.get("v"), int)
    ):
        return None
    return data["r"][:40], int(data["v"])


def _channel_of(payload: dict[str, Any]) -> str:
    found = obj(payload.get("channel")).get("id") or obj(payload.get("container")).get("channel_id")
    return found if isinstance(found, str) and found.isalnum() and len(found) <= 40 else ""


def _block_action(payload: dict[str, Any], account: SlackAccount) -> HttpResponse:
    actions = payload.get("actions")
    if not isinstance(actions, list) or len(actions) != 1 or not isinstance(actions[0], dict):
        return _refuse("malformed_request", "A block action names one action.")
    action = actions[0]
    action_id = action.get("action_id")
    if action_id == "hp:open":
        return HttpResponse(status=200)  # a link button: Slack opened the URL
    channel = _channel_of(payload)
    target = _target(action.get("value"))
    if target is None or not isinstance(action_id, str) or not action_id.startswith("hp:"):
        return _refuse("malformed_request", "The action is not one of Holdpoint's buttons.")
    request_id, round_seen = target
    person = _person(account, channel)
    if person is None:
        return HttpResponse(status=200)
    req = InputRequest.objects.select_related("run").filter(pk=request_id).first()
    refusal = _why_not(req, person, round_seen)
    if refusal:
        slack.say_privately(channel, account.user_id, refusal)
        if req is not None:
            slack.slack_sync(request_id=req.id)
        return HttpResponse(status=200)
    assert req is not None
    meta = {"r": req.id, "v": round_seen, "c": channel}
    trigger = payload.get("trigger_id")
    if action_id == "hp:approve":
        _decide(
            req, person, {"decision": "approve"}, round_seen, _click_key(action), channel, account
        )
    elif action_id == "hp:choose":
        simple = slack.simple_choices(req)
        choice = (json.loads(action["value"]) if isinstance(action.get("value"), str) else {}).get(
            "c"
        )
        if simple is None or choice not in simple[1]:
            slack.say_privately(channel, account.user_id, "That choice is not offered any more.")
        else:
            _decide(
                req, person, {simple[0]: choice}, round_seen, _click_key(action), channel, account
            )
    elif action_id in DECISIONS and isinstance(trigger, str):
        label = "Why do you deny it?" if action_id == "hp:deny" else "What should the agent change?"
        slack.open_modal(
            trigger,
            title="Deny" if action_id == "hp:deny" else "Send back",
            submit="Deny" if action_id == "hp:deny" else "Send back",
            callback="hp:decide",
            meta={**meta, "d": DECISIONS[action_id]},
            blocks=[slack.comment_block(required=True, label=label)],
        )
    elif action_id in ("hp:edit", "hp:form") and isinstance(trigger, str):
        _open_form(req, action_id, meta, trigger, channel, account)
    else:
        return _refuse("malformed_request", "The action is not one of Holdpoint's buttons.")
    return HttpResponse(status=200)


def _click_key(action: dict[str, Any]) -> str:
    """One click, one decision: Slack gives each click its own ``action_ts``."""
    stamp = action.get("action_ts")
    if not isinstance(stamp, str) or not stamp or len(stamp) > 40:
        stamp = json.dumps(action, sort_keys=True)[:200]
    return f"slack:{stamp}"


def _open_form(
    req: InputRequest,
    action_id: str,
    meta: dict[str, Any],
    trigger: str,
    channel: str,
    account: SlackAccount,
) -> None:
    editable = editable_of(req.action)
    try:
        if action_id == "hp:edit":
            if editable is None:
                raise slack.FormUnsupported("nothing to edit")
            fields = slack.form_blocks(editable.schema, current_value(editable, req.edited))
            fields.append(slack.comment_block(required=False, label="Comment (optional)"))
        else:
            fields = slack.form_blocks(req.accepted_schema)
    except slack.FormUnsupported:
        slack.say_privately(
            channel,
            account.user_id,
            f"This form needs the dashboard: <{slack.request_url(req)}|open it in Holdpoint>.",
        )
        return
    slack.open_modal(
        trigger,
        title="Edit and approve" if action_id == "hp:edit" else "Answer",
        submit="Approve" if action_id == "hp:edit" else "Send answer",
        callback=action_id,
        meta=meta,
        blocks=fields,
    )


def _why_not(req: InputRequest | None, person: Any, round_seen: int) -> str:
    """Why this person cannot decide this from this message, in words; "" if they may try
    (the service has the last word, under the run's lock)."""
    if req is None or not person.has_perm("runs.view_run"):
        return "You cannot decide this: there is no such request, or you may not see it."
    perm = permission_for_request_kind(req.kind)
    if not person.has_perm(perm):
        return f"You cannot decide this. {permission_denied_text(perm)}"
    if req.status != RequestStatus.PENDING:
        return "This request is no longer waiting: " + slack._outcome_line(req).replace("*", "")
    if req.kind == RequestKind.AUTH_REQUIRED and req.edit_round != round_seen:
        return "This request was edited since this message was posted; the message shows the edit now. Look again before you decide."
    return ""


def _decide(
    req: InputRequest,
    person: Any,
    value: Any,
    round_seen: int,
    key: str,
    channel: str,
    account: SlackAccount,
) -> dict[str, Any]:
    """Decide through the service, once per key; tell the person what happened (privately)
    and rewrite every message about the request. Returns the outcome: ``ok``, else the
    refusal's ``code``, ``detail`` and the schema's ``errors`` (JSON pointers)."""

    def execute() -> StoredResponse:
        try:
            services.run_resume(
                run_id=req.run_id,
                request_id=req.id,
                checkpoint_id=req.checkpoint_id,
                value=value,
                user=person,
                via=SLACK,
                identity=f"slack:{account.team_id}/{account.user_id}",
                round_seen=round_seen if req.kind == RequestKind.AUTH_REQUIRED else None,
            )
        except HoldpointError as exc:
            body = {
                "ok": False,
                "code": exc.code,
                "detail": exc.detail,
                "errors": exc.extra.get("errors") or [],
            }
            return StoredResponse(
                status=exc.status, body=json.dumps(body).encode(), content_type="application/json"
            )
        return StoredResponse(status=200, body=b'{"ok": true}', content_type="application/json")

    try:
        stored, _replayed = idempotent_call(
            principal=principal_for_user(person),
            key=key[:255],
            method="POST",
            path=PATH,
            body={"request_id": req.id, "value": value},
            execute=execute,
        )
        outcome = json.loads(stored.body)
    except HoldpointError as exc:
        outcome = {"ok": False, "code": exc.code, "detail": exc.detail, "errors": []}
    if outcome.get("ok"):
        req.refresh_from_db()
        decision = value.get("decision") if req.kind == RequestKind.AUTH_REQUIRED else None
        said = {
            "approve": "You approved it.",
            "deny": "You denied it.",
            "respond": "You sent it back.",
        }.get(str(decision), "Your answer was sent.")
        if req.status == RequestStatus.PENDING:
            said += " It waits for more approvals."
        slack.slack_sync(request_id=req.id)
        if channel:
            slack.say_privately(channel, account.user_id, said)
        return outcome
    slack.slack_sync(request_id=req.id)
    if channel and outcome.get("code") != "invalid_input":
        slack.say_privately(
            channel, account.user_id, f"Nothing was decided: {outcome.get('detail')}"
        )
    return outcome


def _view_submission(payload: dict[str, Any], account: SlackAccount) -> HttpResponse:
    view = obj(payload.get("view"))
    callback = view.get("callback_id")
    try:
        meta = json.loads(view.get("private_metadata") or "")
    except ValueError:
        meta = None
    target = _target(meta)
    if (
        callback not in ("hp:decide", "hp:edit", "hp:form")
        or target is None
        or not isinstance(meta, dict)
    ):
        return _refuse("malformed_request", "The view is not one of Holdpoint's forms.")
    request_id, round_seen = target
    found = meta.get("c")
    channel = found if isinstance(found, str) and found.isalnum() else ""
    state = obj(obj(view.get("state")).get("values"))
    person = _person(account, channel)
    if person is None:
        return _errors(
            {
                slack.COMMENT_BLOCK
                if callback != "hp:form"
                else "_": "Link your Slack account first."
            },
            state,
        )
    req = InputRequest.objects.select_related("run").filter(pk=request_id).first()
    refusal = _why_not(req, person, round_seen)
    first_block = next(iter(state), slack.COMMENT_BLOCK)
    if refusal:
        return _errors({first_block: refusal}, state)
    assert req is not None
    comment = slack.comment_of(state)
    if callback == "hp:decide":
        decision = meta.get("d") if meta.get("d") in ("deny", "respond") else None
        if decision is None or not comment:
            return _errors(
                {slack.COMMENT_BLOCK: "Say why; the reason is kept with the run."}, state
            )
        value: dict[str, Any] = {"decision": decision, "comment": comment}
    elif callback == "hp:edit":
        editable = editable_of(req.action)
        if editable is None:
            return _errors({first_block: "This approval offers nothing to edit any more."}, state)
        value = {"decision": "approve", "edited": slack.form_value(editable.schema, state)}
        if comment:
            value["comment"] = comment
    else:
        value = slack.form_value(req.accepted_schema, state)
    # One submission, one decision: the view and what it carried (after a refusal the
    # person submits the same view again with other values).
    digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]
    key = f"slack:view:{str(view.get('id'))[:40]}:{digest}"
    outcome = _decide(req, person, value, round_seen, key, channel, account)
    if outcome.get("ok"):
        return HttpResponse(status=200)
    errors = _field_errors(outcome.get("errors"))
    return _errors(errors or {first_block: str(outcome.get("detail") or "Refused.")}, state)


def _field_errors(errors: Any) -> dict[str, str]:
    """The schema's errors by the modal's block: ``/ttl`` (an answer) and ``/edited/ttl``
    (an approval's edit) are the block ``ttl``."""
    found: dict[str, str] = {}
    for error in errors if isinstance(errors, list) else []:
        if not isinstance(error, dict):
            continue
        pointer = str(error.get("pointer") or "").removeprefix("/edited")
        name = pointer.lstrip("/").split("/", 1)[0].replace("~1", "/").replace("~0", "~")
        if name:
            found.setdefault(name, str(error.get("message") or "Not valid."))
    return found


def _errors(errors: dict[str, str], state: dict[str, Any]) -> HttpResponse:
    """Keep the modal open with ``errors`` beside its blocks (Slack needs a block id that is
    in the view; anything else goes on its first block)."""
    known = {k: v[:1900] for k, v in errors.items() if k in state}
    if not known:
        first = next(iter(state), None)
        if first is None:
            return HttpResponse(status=200)
        known = {first: " ".join(errors.values())[:1900]}
    return JsonResponse({"response_action": "errors", "errors": known})
