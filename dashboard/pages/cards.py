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
from dashboard.approval_notes import not_applied_sentence, without_notes
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
    edit_summary,
    isolate,
    request_outcome_text,
    request_title,
    request_title_html,
    who,
    with_edit,
)
from dashboard.schema_forms import SchemaForm
from runs.access import Actor
from runs.approvals import (
    NotAllowed,
    current_value,
    editable_of,
    editor_of,
    eligible_approvers,
    policy_of,
    standing_votes,
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
class Vote:
    """One person's decision on an approval, as the card shows it: who, when, what, their
    comment, whether it made the edit on the table, and the decision it replaced when they
    changed their mind."""

    who: str
    when: Any
    decision: str  # approve | deny | respond
    comment: str
    made_edit: bool = False
    mine: bool = False
    earlier: Vote | None = None
    open: bool = False  # the request is still pending: a deny is an objection

    @property
    def sentence(self) -> str:
        """ "bob approved 10:02, then denied 10:05", "alice approved with an edit 10:02"."""
        text = _decision_words(self)
        if self.earlier is not None:
            text = _("%(before)s, then %(after)s") % {
                "before": _decision_words(self.earlier),
                "after": _decision_words(self, named=False),
            }
        return text


_DECIDED = {
    # Translators: "alice approved 10:02"
    "approve": lambda who, when: _("%(who)s approved %(when)s") % {"who": who, "when": when},
    "approve_edit": lambda who, when: (
        _("%(who)s approved with an edit %(when)s") % {"who": who, "when": when}
    ),
    "deny": lambda who, when: _("%(who)s denied %(when)s") % {"who": who, "when": when},
    # A deny that left the request open (the policy lets others still approve).
    "object": lambda who, when: _("%(who)s objected %(when)s") % {"who": who, "when": when},
    "respond": lambda who, when: _("%(who)s sent it back %(when)s") % {"who": who, "when": when},
}
_DECIDED_UNNAMED = {
    "approve": lambda when: _("approved %(when)s") % {"when": when},
    "approve_edit": lambda when: _("approved with an edit %(when)s") % {"when": when},
    "deny": lambda when: _("denied %(when)s") % {"when": when},
    "object": lambda when: _("objected %(when)s") % {"when": when},
    "respond": lambda when: _("sent it back %(when)s") % {"when": when},
}


def _decision_words(vote: Vote, *, named: bool = True) -> str:
    key = vote.decision
    if vote.decision == "approve" and vote.made_edit:
        key = "approve_edit"
    elif vote.decision == "deny" and vote.open:
        key = "object"
    when = clock(vote.when)
    if not named:
        found = _DECIDED_UNNAMED.get(key)
        return found(when) if found else f"{vote.decision} {when}"
    who = _("You") if vote.mine else vote.who
    decided = _DECIDED.get(key)
    return decided(who, when) if decided else f"{who} {vote.decision} {when}"


@dataclass
class TeamView:
    """An approval under its policy: how many approvals it needs, each standing decision
    with its comment (and the one it replaced), who else may decide, and the edit on the
    table with who made it (issues 18 and 24)."""

    required: int
    decisions: list[Vote]
    reset: list[Vote]
    others: list[str]
    groups: list[str]
    self_approval: bool
    edit_by: str = ""
    edit_summary: str = ""
    mine: Vote | None = None

    @property
    def given(self) -> list[Vote]:
        return [v for v in self.decisions if v.decision == "approve"]

    @property
    def objections(self) -> list[Vote]:
        return [v for v in self.decisions if v.decision == "deny"]

    @property
    def needed(self) -> int:
        return max(0, self.required - len(self.given))

    @property
    def reset_names(self) -> str:
        return ", ".join(dict.fromkeys(a.who for a in self.reset))

    @property
    def others_text(self) -> str:
        return ", ".join(self.others)

    @property
    def count_text(self) -> str:
        """ "1 of 2 approvals" (empty when one approval is all it takes)."""
        if self.required <= 1:
            return ""
        return ngettext(
            "%(n)s of %(total)s approval", "%(n)s of %(total)s approvals", self.required
        ) % {"n": len(self.given), "total": self.required}

    @property
    def progress(self) -> str:
        """ "1 of 2 approvals: alice 10:02" (empty when one approval is all it takes)."""
        text = self.count_text
        names = ", ".join(f"{a.who} {clock(a.when)}" for a in self.given)
        return f"{text}: {names}" if text and names else text

    @property
    def next_approval(self) -> int:
        """Which approval the next one would be (2 of 3)."""
        return len(self.given) + 1

    @property
    def next_completes(self) -> bool:
        """Whether one more approval meets the policy (the click runs the action)."""
        return self.next_approval >= self.required


def team_view(req: InputRequest, *, viewer: Any = None) -> TeamView:
    """The approval's decisions for the card: the standing ones (``standing_votes``, the
    query of the decisions that count now), each with the decision it replaced when its
    person changed their mind, and the approvals an edit reset. ``viewer``: the pk of the
    person the card is for (their own decision reads "You approved …")."""
    policy = policy_of(req.policy)
    # The request counts its decisions: most cards have none, and ask nothing more.
    standing = (
        list(standing_votes(req).select_related("user").order_by("created_at", "id"))
        if req.decisions
        else []
    )
    # Decisions that no longer count (changed since, or of a round before the last edit):
    # read only when there are any.
    history = (
        list(
            req.votes.select_related("user")
            .exclude(pk__in=[v.pk for v in standing])
            .order_by("created_at", "id")
        )
        if req.decisions > len(standing)
        else []
    )
    edit_vote = next(
        (
            v
            for v in sorted([*standing, *history], key=lambda v: (v.created_at, v.pk))
            if v.round == req.edit_round and v.edited is not None
        ),
        None,
    )

    def who_of(vote: ApprovalVote) -> str:
        return vote.user.get_username() if vote.user is not None else vote.actor

    def same_person(a: ApprovalVote, b: ApprovalVote) -> bool:
        return a.user_id == b.user_id and (a.user_id is not None or a.actor == b.actor)

    def as_vote(vote: ApprovalVote, *, earlier: Vote | None = None) -> Vote:
        return Vote(
            who=who_of(vote),
            when=vote.created_at,
            decision=vote.decision,
            comment=vote.comment,
            made_edit=edit_vote is not None and vote.pk == edit_vote.pk,
            mine=viewer is not None and vote.user_id == viewer,
            earlier=earlier,
            open=req.status == RequestStatus.PENDING,
        )

    decisions = []
    for vote in standing:
        replaced = [
            h
            for h in history
            if h.round == vote.round and same_person(h, vote) and h.created_at <= vote.created_at
        ]
        earlier = as_vote(replaced[-1]) if replaced else None
        decisions.append(as_vote(vote, earlier=earlier))
    reset = [
        as_vote(v)
        for v in history
        if v.round != req.edit_round and v.decision == "approve" and v.superseded_at is None
    ]
    summary = ""
    editable = editable_of(req.action)
    if req.edited is not None and editable is not None:
        summary = edit_summary(editable.value, req.edited)
    others: list[str] = []
    restricted = policy["required"] > 1 or policy["groups"] or not policy["self_approval"]
    if req.status == RequestStatus.PENDING and restricted:
        # Named where the policy narrows who may decide (a plain approval says "Approvers
        # may decide this" and needs no query of everyone who holds the permission).
        others = [u.get_username() for u in eligible_approvers(req, limit=12)]
    return TeamView(
        required=policy["required"],
        decisions=decisions,
        reset=reset,
        others=others,
        groups=list(policy["groups"]),
        self_approval=bool(policy["self_approval"]),
        edit_by=(editor_of(req) or "") if req.edited is not None else "",
        edit_summary=summary,
        mine=next((d for d in decisions if d.mine), None),
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
    # This person approved already (in this round): the card offers no second approval.
    approved_already: bool = False
    # With an edit on the table (or approved): the one diff the card shows. Either the
    # planned change as the edit makes it (``edit_applied``: ``card.action`` is the edited
    # action), or the planned arguments against the edit (``edit_diff``).
    edit_applied: bool = False
    edit_diff: list[Any] = field(default_factory=list)

    expanded: bool = False
    # Shown without its answer form: an e-mail link's confirm page has its own.
    read_only: bool = False

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
    def approved_edit(self) -> Any:
        """For a decided approval: the edit that was approved (None: the plan as shown)."""
        answer = self.req.answer if isinstance(self.req.answer, dict) else {}
        if self.req.status != RequestStatus.ANSWERED or answer.get("decision") != "approve":
            return None
        return answer.get("edited")

    @property
    def approved_edit_summary(self) -> str:
        editable = editable_of(self.req.action)
        edit = self.approved_edit
        if edit is None or editable is None:
            return ""
        return edit_summary(editable.value, edit)

    @property
    def actionable(self) -> bool:
        """Whether this person can act on it now: open, theirs to answer, and for an
        approval theirs to approve (the inbox opens such a card first)."""
        return self.is_open and self.can_answer and not self.approve_blocked and not self.broken

    @property
    def approve_step(self) -> bool:
        """The approval this person would give is not the last the policy needs: the
        button says "Approve … (1 of 2)", not "Approve and run"."""
        return self.team is not None and not self.team.next_completes

    @property
    def approve_danger(self) -> bool:
        """The red button: this approval completes the policy and what runs then cannot be
        undone (or nobody said whether it can)."""
        reversibility = self.action.reversibility if self.action is not None else ""
        return not self.approve_step and reversibility in ("irreversible", "")

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

    # Issue 24: an earlier approval that this request replaces and that was not applied
    # (dashboard/approval_notes.py). One block; the card shows it above the action.
    @property
    def not_applied_note(self) -> str:
        return not_applied_sentence(self.req.context)

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
        """Who decided: for an approval that needed several people, all of them ("alice
        and bob"), not only the last."""
        answer = self.req.answer if isinstance(self.req.answer, dict) else {}
        approvers = answer.get("approvers") if self.is_approval else None
        if isinstance(approvers, list) and len(approvers) > 1:
            names = [str(a) for a in approvers]
            return _("%(people)s and %(last)s") % {
                "people": ", ".join(names[:-1]),
                "last": names[-1],
            }
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
        mine = team.mine if team is not None else None
        if mine is not None and mine.decision == "approve":
            text = _(
                "You already approved this at %(when)s; it needs approvals from other "
                "people. You may still deny it or send it back."
            ) % {"when": clock(mine.when)}
        else:
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
        card.context = context_items(without_notes(req.context))
        if req.kind == RequestKind.AUTH_REQUIRED:
            card.action = describe_action(req.action)
            card.approval = ApprovalForm(data) if data is not None else ApprovalForm()
            card.earlier = earlier_decisions(req)
            card.team = team_view(req, viewer=user.pk)
            editable = editable_of(req.action)
            edit = req.edited if req.status == RequestStatus.PENDING else card.approved_edit
            if edit is not None and editable is not None:
                # One diff, never two (issue 24): the change as the edit makes it, else
                # the plan against the edit in the place of the planned change.
                merged = with_edit(req.action, editable.value, edit)
                if merged is not None:
                    card.action = describe_action(merged)
                    card.edit_applied = True
                else:
                    card.edit_diff = before_after_diff(
                        editable.value, edit, _("arguments"), labels=(_("planned"), _("edited"))
                    )
            if editable is not None and req.status == RequestStatus.PENDING:
                card.edit_form = SchemaForm(
                    editable.schema,
                    data,
                    prefix=f"{req.id}-edit",
                    initial=current_value(editable, req.edited),
                    allow_buttons=False,
                )
            decider = _decider(user)
            if card.can_answer and req.status == RequestStatus.PENDING and decider is not None:
                why = why_not_decide(req, decider, "approve")
                if why is not None and why.reason == "not_in_group":
                    card.can_answer = False
                    card.who_can = why_not_text(why, card.team)
                elif why is not None:
                    card.approve_blocked = why_not_text(why, card.team)
                    card.approved_already = why.reason == "already_approved"
        else:
            card.form = SchemaForm(req.accepted_schema, data, prefix=req.id)
    except Exception:
        # A request that cannot be rendered is still shown, raw, with a link to its run.
        # What went wrong is in the log; a person reads a sentence, not a Python class.
        logger.exception("request %s could not be rendered", req.id)
        card.broken = _(
            "This request could not be shown as a form. Its raw content is below; the run "
            "page has the rest."
        )
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


def _decider(user: Actor) -> Any:
    """Whom ``why_not_decide`` judges for this card: the person it is rendered for. A
    signed-in user as they are; a live push's ``Person`` (its ``pk`` and permissions) as
    the user with that ``pk``, unsaved and unread (the rule looks the person's decisions
    and groups up by it); None for a ``Role``, which is nobody in particular (a card
    rendered for a role is one whose policy judges everyone alike: ``live/consumers.py``)."""
    from django.contrib.auth import get_user_model
    from django.db.models import Model

    if not user.is_authenticated or user.pk is None:
        return None
    if isinstance(user, Model):
        return user
    return get_user_model()(pk=user.pk)


def next_pending(user: Actor, *, exclude: str) -> InputRequest | None:
    """The request to offer next (docs/dashboard.md)."""
    return (
        inbox_for_user(user=user).exclude(pk=exclude).filter(expires_at__gt=timezone.now()).first()
    )
