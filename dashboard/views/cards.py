"""The request card: one input request or approval, answerable in place.

The same card is rendered in the inbox and on the run page; after an answer it
comes back read-only, saying who decided what and when.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard.actions import new_idempotency_key
from dashboard.forms import ApprovalForm
from dashboard.present import (
    ActionView,
    ContextItem,
    answer_rows,
    answer_summary,
    clock,
    context_items,
    decision_of,
    describe_action,
    isolate,
    request_outcome_text,
    request_title,
    request_title_html,
    who,
)
from dashboard.schema_forms import SchemaForm
from runs.access import Actor
from runs.models import InputRequest
from runs.selectors import inbox_for_user, permission_for_request_kind
from runs.states import RequestKind, RequestStatus

logger = logging.getLogger(__name__)


# What the SDK writes when the agent gives no prompt or reason (runtime.context): shown
# as translated sentences instead, never as stored English.
_SDK_PROMPT = re.compile(r"^Approve .+ on .+\?( It cannot be undone\.)?$", re.S)
_LEDGER_REASON = re.compile(
    r"^(?P<tool>.+) on (?P<target>.+) cannot be undone; step '(?P<step>.+)' needs an approval "
    r"first\.$",
    re.S,
)


def reason_sentence(req: InputRequest) -> str:
    """Why the approval is asked, as a sentence in the reader's language when the product
    wrote it (the ledger's reason for an irreversible effect); the agent's own words as
    they are."""
    found = _LEDGER_REASON.match(req.reason or "")
    if found:
        return _("%(tool)s on %(target)s cannot be undone, so a person decides before it runs.") % {
            "tool": found["tool"],
            "target": found["target"],
        }
    return req.reason


@dataclass
class EarlierDecision:
    """An earlier approval request of the same run on the same tool and target: who
    decided what and when, with their comment and the change they were shown."""

    req: InputRequest
    decision: str
    who: str
    when: Any
    comment: str
    action: ActionView


def earlier_decisions(req: InputRequest) -> list[EarlierDecision]:
    action = req.action if isinstance(req.action, dict) else {}
    tool, target = action.get("tool"), action.get("target")
    if req.kind != RequestKind.AUTH_REQUIRED or not tool or not target:
        return []
    found = (
        InputRequest.objects.select_related("answered_by")
        .filter(
            run_id=req.run_id,
            kind=RequestKind.AUTH_REQUIRED,
            status=RequestStatus.ANSWERED,
            action__tool=tool,
            action__target=target,
            created_at__lte=req.created_at,
        )
        .exclude(pk=req.pk)
        .order_by("answered_at", "id")[:10]
    )
    return [
        EarlierDecision(
            req=earlier,
            decision=decision_of(earlier),
            who=who(earlier),
            when=earlier.answered_at,
            comment=answer_summary(earlier),
            action=describe_action(earlier.action),
        )
        for earlier in found
    ]


@dataclass
class RequestCard:
    req: InputRequest
    origin: str  # "inbox" or "run": where the card is shown, and so what a POST returns
    can_answer: bool
    who_can: str
    key: str
    title: str = ""
    title_html: str = ""  # the title with the agent's text isolated (<bdi>)
    form: SchemaForm | None = None
    approval: ApprovalForm | None = None
    action: ActionView | None = None
    message: str = ""
    message_level: str = "info"
    next_pending: InputRequest | None = None
    broken: str = ""
    raw_json: str = ""
    context: list[ContextItem] = field(default_factory=list)
    # Earlier decisions of this run on the same tool and target (issue 15, point 3).
    earlier: list[EarlierDecision] = field(default_factory=list)

    expanded: bool = False

    @property
    def deciders(self) -> str:
        """Who may decide, in a word or two, for the inbox row."""
        if self.is_approval:
            return _("Approvers")
        return _("Operators, approvers")

    @property
    def reason_text(self) -> str:
        return reason_sentence(self.req)

    @property
    def prompt_text(self) -> str:
        """The agent's prompt, unless it is the SDK's default wording (the title says it)."""
        return "" if _SDK_PROMPT.match(self.req.prompt or "") else self.req.prompt

    @property
    def asked_again_after_denial(self) -> bool:
        return any(e.decision == "deny" for e in self.earlier)

    @property
    def run(self) -> Any:
        return self.req.run

    @property
    def is_approval(self) -> bool:
        return self.req.kind == RequestKind.AUTH_REQUIRED

    @property
    def is_open(self) -> bool:
        """Pending and not past its expiry: the form is shown."""
        return self.req.status == RequestStatus.PENDING and self.req.expires_at > timezone.now()

    @property
    def outcome(self) -> str:
        return request_outcome_text(self.req)

    @property
    def decision(self) -> str:
        return decision_of(self.req)

    @property
    def answered_by(self) -> str:
        return who(self.req)

    @property
    def answered_at(self) -> str:
        return clock(self.req.answered_at)

    @property
    def answer_text(self) -> str:
        return answer_summary(self.req)

    @property
    def answer_rows(self) -> list[tuple[str, str]]:
        return answer_rows(self.req)

    @property
    def expiry_clock(self) -> str:
        return clock(self.req.expires_at, zone=True)

    @property
    def html_id(self) -> str:
        return f"request-{self.req.id}"

    @property
    def version(self) -> str:
        return card_version(self.req, can_answer=self.can_answer)


def card_version(req: InputRequest, *, can_answer: bool) -> str:
    """What decides how a card looks and what it lets a person do.

    A live page keeps a card whose version a push did not change, with whatever the
    person has typed into it (``data-version``, app.js); the consumers also compare it
    to know which cards to send.
    """
    is_open = req.status == RequestStatus.PENDING and req.expires_at > timezone.now()
    return f"{req.status}.{'open' if is_open else 'shut'}.{'can' if can_answer else 'cannot'}"


def who_can_text(kind: str) -> str:
    if kind == RequestKind.AUTH_REQUIRED:
        return _("Only approvers can approve or deny this.")
    return _("Only people who may answer requests (operators, approvers) can answer this.")


def build_card(
    req: InputRequest,
    *,
    user: Actor,
    origin: str,
    data: Any = None,
    message: str = "",
    message_level: str = "info",
    with_next: bool = False,
) -> RequestCard:
    """A card for ``req``; ``data`` (a POST) binds its form to show the values and errors."""
    card = RequestCard(
        req=req,
        origin=origin,
        can_answer=user.has_perm(permission_for_request_kind(req.kind)),
        who_can=who_can_text(req.kind),
        key=new_idempotency_key(),
        message=message,
        message_level=message_level,
    )
    try:
        card.title = request_title(req)
        card.title_html = request_title_html(req)
        card.context = context_items(req.context)
        if req.kind == RequestKind.AUTH_REQUIRED:
            card.action = describe_action(req.action)
            card.approval = ApprovalForm(data) if data is not None else ApprovalForm()
            card.earlier = earlier_decisions(req)
        else:
            card.form = SchemaForm(req.accepted_schema, data, prefix=req.id)
    except Exception as exc:
        # a request that cannot be rendered is still shown, raw, with a link to its run.
        logger.exception("request %s could not be rendered", req.id)
        card.broken = _("This request could not be shown as a form (%(error)s).") % {
            "error": type(exc).__name__
        }
        card.title = req.prompt
        card.title_html = isolate(req.prompt)
        card.form = None
        card.approval = None
    if card.broken:
        card.raw_json = json.dumps(
            {
                "prompt": req.prompt,
                "accepted_schema": req.accepted_schema,
                "context": req.context,
                "action": req.action,
            },
            ensure_ascii=False,
            indent=2,
            default=str,
        )
    if with_next:
        card.next_pending = next_pending(user, exclude=req.id)
    return card


def next_pending(user: Actor, *, exclude: str) -> InputRequest | None:
    """The request to offer next (docs/dashboard.md)."""
    return (
        inbox_for_user(user=user).exclude(pk=exclude).filter(expires_at__gt=timezone.now()).first()
    )
