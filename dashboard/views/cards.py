"""The request card: one input request or approval, answerable in place.

The same card is rendered in the inbox and on the run page; after an answer it
comes back read-only, saying who decided what and when.
"""

from __future__ import annotations

import json
import logging
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
from runs.models import InputRequest
from runs.selectors import inbox_for_user, permission_for_request_kind
from runs.states import RequestKind, RequestStatus

logger = logging.getLogger(__name__)


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
    user: Any,
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
        else:
            card.form = SchemaForm(req.accepted_schema, data, prefix=req.id)
    except Exception as exc:
        # UX 3: a request that cannot be rendered is still shown, raw, with a link to its run.
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


def next_pending(user: Any, *, exclude: str) -> InputRequest | None:
    """The request to offer next (UX 4: "Next pending →")."""
    return (
        inbox_for_user(user=user).exclude(pk=exclude).filter(expires_at__gt=timezone.now()).first()
    )
