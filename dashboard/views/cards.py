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
from django.utils.translation import ngettext

from dashboard.actions import new_idempotency_key
from dashboard.forms import ApprovalForm
from dashboard.present import (
    ActionView,
    ContextItem,
    answer_rows,
    answer_summary,
    before_after_diff,
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
from runs.approvals import (
    NotAllowed,
    current_value,
    editable_of,
    eligible_approvers,
    policy_of,
    why_not_decide,
)
from runs.models import ApprovalVote, InputRequest
from runs.selectors import inbox_for_user, notifications_summary, permission_for_request_kind
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
class Approver:
    """One approval that counts (or counted, before an edit reset it)."""

    who: str
    when: Any
    comment: str
    edited: bool


@dataclass
class TeamView:
    """An approval under its policy: how many approvals it needs, who gave them and when,
    who else may decide, and the edit on the table (issue 18)."""

    required: int
    given: list[Approver]
    reset: list[Approver]
    others: list[str]
    groups: list[str]
    self_approval: bool
    objections: list[Approver]
    edit_diff: list[Any]
    edited_by: str

    @property
    def needed(self) -> int:
        return max(0, self.required - len(self.given))

    @property
    def reset_names(self) -> str:
        return ", ".join(a.who for a in self.reset)

    @property
    def others_text(self) -> str:
        return ", ".join(self.others)

    @property
    def progress(self) -> str:
        """ "1 of 2 approvals: alice 10:02" (empty when one approval is all it takes)."""
        if self.required <= 1:
            return ""
        names = ", ".join(f"{a.who} {clock(a.when)}" for a in self.given)
        text = ngettext(
            "%(n)s of %(total)s approval", "%(n)s of %(total)s approvals", self.required
        ) % {"n": len(self.given), "total": self.required}
        return f"{text}: {names}" if names else text


def team_view(req: InputRequest) -> TeamView:
    policy = policy_of(req.policy)
    # The request counts its decisions: most cards have none, and ask nothing more.
    votes = (
        list(ApprovalVote.objects.select_related("user").filter(request=req)[:100])
        if req.decisions
        else []
    )

    def approver(vote: ApprovalVote) -> Approver:
        name = vote.user.get_username() if vote.user is not None else vote.actor
        return Approver(name, vote.created_at, vote.comment, vote.edited is not None)

    approvals = [v for v in votes if v.decision == "approve"]
    editors = [v for v in approvals if v.round == req.edit_round and v.edited is not None]
    editable = editable_of(req.action)
    diff: list[Any] = []
    if req.edited is not None and editable is not None:
        diff = before_after_diff(editable.value, req.edited, _("arguments"))
    others: list[str] = []
    restricted = policy["required"] > 1 or policy["groups"] or not policy["self_approval"]
    if req.status == RequestStatus.PENDING and restricted:
        # Named where the policy narrows who may decide (a plain approval says "Approvers
        # may decide this" and needs no query of everyone who holds the permission).
        others = [u.get_username() for u in eligible_approvers(req, limit=12)]
    return TeamView(
        required=policy["required"],
        given=[approver(v) for v in approvals if v.round == req.edit_round],
        reset=[approver(v) for v in approvals if v.round != req.edit_round],
        others=others,
        groups=list(policy["groups"]),
        self_approval=bool(policy["self_approval"]),
        objections=[approver(v) for v in votes if v.decision == "deny"],
        edit_diff=diff,
        edited_by=approver(editors[0]).who if editors else "",
    )


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
    # The approval's policy, its approvals so far and its edit (issue 18).
    team: TeamView | None = None
    # The form to edit the planned arguments before approving (``action.editable``).
    edit_form: SchemaForm | None = None
    # Why this person may not approve (rule 11 of the UX guide: say why, not only who).
    approve_blocked: str = ""

    expanded: bool = False

    @property
    def notified(self) -> list[str]:
        """Who was told and when: "Notified 3 people 10:02", "Escalated to on-call 10:32"."""
        lines = []
        for row in notifications_summary(self.req):
            when = clock(row["first_at"])
            people = ngettext("%(n)s person", "%(n)s people", row["people"]) % {"n": row["people"]}
            if row["groups"] and row["kind"] != "escalation":
                people += " " + ngettext(
                    "and %(n)s group webhook", "and %(n)s group webhooks", row["groups"]
                ) % {"n": row["groups"]}
            if row["kind"] == "escalation":
                lines.append(
                    _("Escalated to %(group)s %(when)s")
                    % {"group": row.get("escalated_to") or "—", "when": when}
                )
            elif row["kind"] == "reminder":
                lines.append(_("Reminded %(people)s %(when)s") % {"people": people, "when": when})
            else:
                lines.append(_("Notified %(people)s %(when)s") % {"people": people, "when": when})
        return lines

    @property
    def edit_open(self) -> bool:
        """Open the edit form when it has errors or an edit is already on the table."""
        form = self.edit_form
        return form is not None and (
            bool(form.errors) or any(f.errors for f in form.fields()) or self.req.edited is not None
        )

    @property
    def decided_edit_diff(self) -> list[Any]:
        """For a decided approval: the original arguments against the approved edit."""
        answer = self.req.answer if isinstance(self.req.answer, dict) else {}
        editable = editable_of(self.req.action)
        if "edited" not in answer or editable is None:
            return []
        return before_after_diff(editable.value, answer["edited"], _("arguments"))

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
    to know which cards to send. An approval's decisions so far count too: another
    approver's approval or edit changes the card.
    """
    is_open = req.status == RequestStatus.PENDING and req.expires_at > timezone.now()
    version = f"{req.status}.{'open' if is_open else 'shut'}.{'can' if can_answer else 'cannot'}"
    if req.kind == RequestKind.AUTH_REQUIRED and is_open and req.decisions:
        version += f".{req.edit_round}.{req.decisions}"
    return version


def why_not_text(why: NotAllowed, team: TeamView | None) -> str:
    """Why this person may not decide (or approve), and who may, in the reader's language."""
    others = ", ".join(team.others) if team is not None and team.others else ""
    if why.reason == "not_in_group":
        groups = ", ".join(team.groups) if team is not None else ""
        text = _("Only members of %(groups)s may decide this approval.") % {"groups": groups}
    elif why.reason == "self_approval":
        text = _(
            "You started this run or answered its last question; its policy needs someone "
            "else to approve. You may still deny it or send it back."
        )
    elif why.reason == "already_approved":
        text = _("You already approved this; it needs approvals from other people.")
    else:
        text = why.detail
    if others:
        text += " " + _("Who may approve: %(people)s.") % {"people": others}
    return text


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
            card.team = team_view(req)
            editable = editable_of(req.action)
            if editable is not None and req.status == RequestStatus.PENDING:
                card.edit_form = SchemaForm(
                    editable.schema,
                    data,
                    prefix=f"{req.id}-edit",
                    initial=current_value(editable, req.edited),
                    allow_buttons=False,
                )
            if card.can_answer and req.status == RequestStatus.PENDING:
                why = why_not_decide(req, user, "approve")
                if why is not None and why.reason == "not_in_group":
                    card.can_answer = False
                    card.who_can = why_not_text(why, card.team)
                elif why is not None:
                    card.approve_blocked = why_not_text(why, card.team)
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
