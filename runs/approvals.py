"""The rules of an approval: its answer, its policy, and who may decide it.

No writes here: ``runs/services/approvals.py`` records decisions under the run's lock.

**The answer** to an ``auth_required`` request is ``{"decision": "approve" | "deny" |
"respond", "comment": "…", "edited": {…}?}``. A comment is required to deny or to send
back (``respond``). ``edited`` is only for an approval of a request that offers its
arguments for editing (``action.editable``: a schema and the planned value); it is checked
with the one validator of answers (``runs/schemas.py``), and an edit that changes nothing
is a plain approval.

**The policy** (per agent, and per tool/target pattern within it) says which groups may
decide, how many distinct people must approve, whether the person who started the run or
answered its last question may approve (``self_approval``; by default not for an
irreversible effect) and whether one deny closes the request (default yes). A request
keeps the policy it was asked under (``InputRequest.policy``), resolved when it is asked.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from django.utils.translation import gettext

from runs.errors import HoldpointError
from runs.schemas import (
    APPROVAL_SCHEMA,
    canonical_json,
    compile_schema,
    too_deep,
    validation_errors,
)


class ApprovalAnswer(TypedDict, total=False):
    """An approval request's answer: the decision, the comment, the arguments as edited (an
    edit that counts), and the approvers when the policy needed more than one."""

    decision: str
    comment: str
    edited: Any
    approvers: list[str]


class Escalation(TypedDict):
    after_minutes: int
    group: str


class Policy(TypedDict, total=False):
    """The policy one approval is asked under (``resolve_policy``; stored on the request).
    ``rule`` names the matched tool/target rule, ``source`` where the agent's policy came
    from (``operator``, ``code``, ``default``)."""

    groups: list[str]
    required: int
    self_approval: bool
    any_deny_closes: bool
    rule: str | None
    source: str
    escalation: Escalation
    remind: float


DECISIONS = ("approve", "deny", "respond")
MAX_COMMENT = 2000
MAX_REQUIRED = 10
MAX_GROUPS = 20
MAX_RULES = 50
MAX_EDITED_BYTES = 64 * 1024
_POLICY_FIELDS = {"groups", "required", "self_approval", "any_deny_closes", "escalation", "remind"}
_ESCALATION_FIELDS = {"after_minutes", "group"}


# --- The answer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Editable:
    """What an approver may change before approving: the schema and the planned value.

    ``request_schema`` is the tool's own request schema when the approval edits a tool's
    request (the ledger's approval before an irreversible call): the server adds it when
    the approval is asked (``runs/services/approvals.py`` ``approval_action``), never the
    worker, and an edit must fit it too.
    """

    schema: dict[str, Any]
    value: Any
    request_schema: dict[str, Any] | None = None


def editable_of(action: Any) -> Editable | None:
    """The editable arguments an approval offers (``action.editable``), or None."""
    if not isinstance(action, dict):
        return None
    found = action.get("editable")
    if not isinstance(found, dict) or not isinstance(found.get("schema"), dict):
        return None
    request_schema = found.get("request_schema")
    return Editable(
        schema=found["schema"],
        value=found.get("value"),
        request_schema=request_schema if isinstance(request_schema, dict) else None,
    )


def check_editable(editable: Any) -> dict[str, Any] | None:
    """Check an approval's ``action.editable`` when it is asked: ``{"schema": …, "value": …}``
    with a valid schema (compact form compiled) and a planned value that the schema accepts
    (an approver must be able to approve the plan as it is). Raises ``invalid_input``."""
    if editable is None:
        return None
    if not isinstance(editable, dict) or set(editable) - {"schema", "value"}:
        raise HoldpointError(
            "invalid_input", "action.editable must be an object with schema and value."
        )
    schema = compile_schema(editable.get("schema"))
    value = editable.get("value")
    errors = validation_errors(schema, value)
    if errors:
        raise HoldpointError(
            "invalid_input",
            "The planned arguments do not match their own editable schema.",
            errors=[
                {**e, "pointer": "/action/editable/value" + e["pointer"].rstrip("/")}
                for e in errors
            ],
        )
    return {"schema": schema, "value": value}


def current_value(editable: Editable, edited: Any) -> Any:
    """What an approval would approve now: the last edit, else the plan."""
    return edited if edited is not None else editable.value


def edit_that_counts(action: Any, edited: Any) -> Any:
    """The edit an approval answers with: None when there is none, or when the edits
    brought the arguments back to the plan (30 → 45 → 30 approves the plan: a plain
    approval, run under the plan's key)."""
    editable = editable_of(action)
    if edited is None or editable is None or same(edited, editable.value):
        return None
    return edited


def same(a: Any, b: Any) -> bool:
    return canonical_json(a) == canonical_json(b)


def approval_answer(action: Any, value: Any, *, current_edit: Any = None) -> ApprovalAnswer:
    """The answer ``value`` checked and normalised, or ``invalid_input`` with pointers.

    ``current_edit`` is the request's edit so far (an earlier approver's): an ``edited``
    equal to what is on the table now is no edit. The result carries ``edited`` only
    when it changes something.
    """
    errors = validation_errors(APPROVAL_SCHEMA, value)
    if errors:
        raise HoldpointError(
            "invalid_input", "The answer does not match the schema.", errors=errors
        )
    decision = value["decision"]
    comment = str(value.get("comment") or "").strip()
    if decision in ("deny", "respond") and not comment:
        raise HoldpointError(
            "invalid_input",
            "Say why: a comment is required to deny or to send back.",
            errors=[{"pointer": "/comment", "message": "required to deny or respond"}],
        )
    answer: ApprovalAnswer = {"decision": decision}
    if comment:
        answer["comment"] = comment
    if "edited" not in value:
        return answer
    edited = value["edited"]
    if decision != "approve":
        raise HoldpointError(
            "invalid_input",
            "Only an approval carries edited arguments.",
            errors=[{"pointer": "/edited", "message": "only with decision approve"}],
        )
    editable = editable_of(action)
    if editable is None:
        raise HoldpointError(
            "invalid_input",
            "This approval's arguments cannot be edited.",
            errors=[{"pointer": "/edited", "message": "not editable"}],
        )
    if too_deep(edited) or len(canonical_json(edited).encode()) > MAX_EDITED_BYTES:
        raise HoldpointError(
            "invalid_input",
            "The edited arguments are too large.",
            errors=[{"pointer": "/edited", "message": "too large"}],
        )
    problems = validation_errors(editable.schema, edited)
    if not problems and editable.request_schema is not None:
        # The edited request is what the tool will be given: it must fit the tool too.
        problems = validation_errors(editable.request_schema, edited)
    if problems:
        raise HoldpointError(
            "invalid_input",
            "The edited arguments do not match their schema.",
            errors=[
                {**e, "pointer": "/edited" + ("" if e["pointer"] == "/" else e["pointer"])}
                for e in problems
            ],
        )
    if not same(edited, current_value(editable, current_edit)):
        answer["edited"] = edited
    return answer


# --- The policy ------------------------------------------------------------------------------


def _check_groups(groups: Any, where: str) -> list[str]:
    if not isinstance(groups, list | tuple) or len(groups) > MAX_GROUPS:
        raise ValueError(f"{where}groups must be a list of at most {MAX_GROUPS} group names")
    if not all(isinstance(g, str) and 0 < len(g) <= 150 for g in groups):
        raise ValueError(f"{where}groups must be group names (1 to 150 characters)")
    return list(dict.fromkeys(groups))


def _check_fields(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'the policy '}must be a JSON object")
    unknown = set(data) - _POLICY_FIELDS - ({"rules"} if not where else {"match"})
    if unknown:
        raise ValueError(f"{where}unknown policy fields: {', '.join(sorted(unknown))}")
    out: dict[str, Any] = {}
    if "groups" in data:
        out["groups"] = _check_groups(data["groups"], where)
    if "required" in data:
        n = data["required"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REQUIRED:
            raise ValueError(f"{where}required must be a whole number from 1 to {MAX_REQUIRED}")
        out["required"] = n
    for flag in ("self_approval", "any_deny_closes"):
        if flag in data:
            if data[flag] is not None and not isinstance(data[flag], bool):
                raise ValueError(f"{where}{flag} must be true, false or null")
            out[flag] = data[flag]
    if "escalation" in data and data["escalation"] is not None:
        esc = data["escalation"]
        if not isinstance(esc, dict) or set(esc) - _ESCALATION_FIELDS:
            raise ValueError(f"{where}escalation must be {{after_minutes, group}}")
        minutes = esc.get("after_minutes")
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 43200:
            raise ValueError(f"{where}escalation.after_minutes must be 1 to 43200")
        _check_groups([esc.get("group")], f"{where}escalation.")
        out["escalation"] = {"after_minutes": minutes, "group": esc["group"]}
    if "remind" in data and data["remind"] is not None:
        share = data["remind"]
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
            raise ValueError(f"{where}remind must be a share of the time left, between 0 and 1")
        out["remind"] = float(share)
    return out


def parse_policy(data: Any) -> dict[str, Any]:
    """An approval policy checked and normalised, or ``ValueError`` saying what is wrong.

    ``{"groups": [...], "required": 2, "self_approval": false, "any_deny_closes": true,
    "rules": [{"match": "config_store:prod/*", "required": 2}, ...]}``. A rule's ``match``
    is ``tool`` or ``tool:target`` with shell-style wildcards; the first rule that matches
    an approval's tool and target overrides the agent's fields.
    """
    if data is None:
        return {}
    out = _check_fields(data, "")
    if "rules" in data:
        rules = data["rules"]
        if not isinstance(rules, list) or len(rules) > MAX_RULES:
            raise ValueError(f"rules must be a list of at most {MAX_RULES} rules")
        checked = []
        for index, rule in enumerate(rules):
            where = f"rules[{index}]."
            fields = _check_fields(rule, where)
            match = rule.get("match")
            if not isinstance(match, str) or not 0 < len(match) <= 300:
                raise ValueError(
                    f"{where}match must be 'tool' or 'tool:target' (wildcards allowed)"
                )
            checked.append({"match": match, **fields})
        out["rules"] = checked
    return out


def policy_error(exc: ValueError) -> HoldpointError:
    return HoldpointError("invalid_input", f"The approval policy is not valid: {exc}.")


def _matches(pattern: str, tool: str, target: str) -> bool:
    tool_pattern, _, target_pattern = pattern.partition(":")
    return fnmatch.fnmatchcase(tool, tool_pattern) and (
        not target_pattern or fnmatch.fnmatchcase(target, target_pattern)
    )


def resolve_policy(
    policy: dict[str, Any] | None, *, tool: str, target: str, reversibility: str
) -> Policy:
    """The policy one approval is asked under: the agent's fields, overridden by the first
    rule that matches its tool and target, with every default filled in."""
    policy = policy or {}
    fields = {k: v for k, v in policy.items() if k != "rules"}
    matched = None
    for rule in policy.get("rules") or []:
        if _matches(rule["match"], tool, target):
            matched = rule["match"]
            fields.update({k: v for k, v in rule.items() if k != "match"})
            break
    self_approval = fields.get("self_approval")
    if self_approval is None:
        self_approval = reversibility != "irreversible"
    any_deny = fields.get("any_deny_closes")
    resolved: Policy = {
        "groups": list(fields.get("groups") or []),
        "required": int(fields.get("required") or 1),
        "self_approval": bool(self_approval),
        "any_deny_closes": True if any_deny is None else bool(any_deny),
        "rule": matched,
    }
    if fields.get("escalation"):
        resolved["escalation"] = fields["escalation"]
    if fields.get("remind"):
        resolved["remind"] = fields["remind"]
    return resolved


DEFAULT_POLICY = {
    "groups": [],
    "required": 1,
    "self_approval": True,
    "any_deny_closes": True,
    "rule": None,
}


def policy_of(request_policy: Any) -> Policy:
    """A request's stored policy, with the defaults of a request asked before policies."""
    found = request_policy if isinstance(request_policy, dict) else {}
    return cast(Policy, {**DEFAULT_POLICY, **found})


# --- Who may decide --------------------------------------------------------------------------


@dataclass(frozen=True)
class NotAllowed:
    """Why a person may not decide an approval: a stable ``reason`` code and a sentence."""

    reason: str
    detail: str


def _in_groups(user: Any, groups: list[str]) -> bool:
    """Whether ``user`` is a member of one of the policy's ``groups`` (any user when it
    names none). A policy's groups bind everyone, superusers too: an administrator who
    must decide joins the group, which is an audited change, instead of passing by."""
    if not groups:
        return True
    if hasattr(user, "groups"):
        return user.groups.filter(name__in=groups).exists()
    if user.pk is None:
        # A ``Role`` (a push shared by everyone with the same permissions) is nobody in
        # particular: say nothing of groups there; the service still refuses a non-member.
        return True
    # A ``Person`` (a live push for one signed-in person): only their pk and permissions.
    from django.contrib.auth.models import Group

    return Group.objects.filter(user__pk=user.pk, name__in=groups).exists()


def _last_answerer_id(request: Any) -> Any:
    """Who answered the run's last question before this approval was asked."""
    from runs.models import InputRequest
    from runs.states import RequestKind, RequestStatus

    return (
        InputRequest.objects.filter(
            run_id=request.run_id,
            kind=RequestKind.INPUT_REQUIRED,
            status=RequestStatus.ANSWERED,
            answered_at__lte=request.created_at,
        )
        .order_by("-answered_at")
        .values_list("answered_by_id", flat=True)
        .first()
    )


def standing_votes(request: Any) -> Any:
    """The decisions that count now: this round's (an edit starts a new one), as each
    person last decided (a change of mind supersedes the earlier decision). The one query
    on the votes that the service, the card, the API and the notifications read."""
    from runs.models import ApprovalVote

    return ApprovalVote.objects.standing().filter(request=request, round=request.edit_round)


def editor_of(request: Any) -> str | None:
    """Who made the edit on the table: the person whose approval started this round with
    its arguments (their username, or the actor for the system). None without an edit."""
    from runs.models import ApprovalVote

    if request.edited is None:
        return None
    vote = (
        ApprovalVote.objects.select_related("user")
        .filter(request=request, round=request.edit_round)
        .exclude(edited__isnull=True)
        .order_by("created_at", "id")
        .first()
    )
    if vote is None:
        return None
    return vote.user.get_username() if vote.user is not None else vote.actor


def is_new_edit(action: Any, value: Any, current_edit: Any) -> bool:
    """Whether ``value`` approves with arguments other than those on the table (an edit
    that starts a new round)."""
    editable = editable_of(action)
    return (
        editable is not None
        and isinstance(value, dict)
        and value.get("decision") == "approve"
        and "edited" in value
        and not same(value["edited"], current_value(editable, current_edit))
    )


def why_not_decide(
    request: Any, user: Any, decision: str = "approve", *, new_edit: bool = False
) -> NotAllowed | None:
    """Why ``user`` may not take ``decision`` on the approval ``request`` under its policy
    (None: they may). The approve permission itself is checked by the caller. ``new_edit``:
    the approval changes the arguments, so an approval of the old ones does not count."""
    policy = policy_of(request.policy)
    if user is None or not getattr(user, "is_authenticated", False):
        # The system (a script on the server, ``answerrun``) is no person of a group.
        return None
    groups = policy["groups"]
    if not _in_groups(user, groups):
        return NotAllowed(
            "not_in_group",
            gettext("Only members of %(groups)s may decide this approval.")
            % {"groups": ", ".join(groups)},
        )
    if decision != "approve":
        return None
    if not policy["self_approval"] and user.pk is not None:
        # A live push's ``Role`` (pk None) is nobody in particular: never "you started it".
        run_creator = getattr(request.run, "created_by_id", None)
        if run_creator is not None and run_creator == user.pk:
            return NotAllowed(
                "self_approval",
                gettext("You started this run; its policy needs someone else to approve this."),
            )
        if _last_answerer_id(request) == user.pk:
            return NotAllowed(
                "self_approval",
                gettext(
                    "You answered this run's last question; its policy needs someone else "
                    "to approve this."
                ),
            )
    if (
        not new_edit
        and request.decisions
        and user.pk is not None
        and standing_votes(request).filter(user_id=user.pk, decision="approve").exists()
    ):
        return NotAllowed(
            "already_approved",
            gettext("You already approved this; it needs approvals from other people."),
        )
    return None


def why_not_preapprove(policy: dict[str, Any] | None, user: Any) -> NotAllowed | None:
    """Why ``user`` may not approve steps of a run when they start it (None: they may).

    A pre-approval (``run_start(approvals=[…])``) is the starter's vote, given before
    anyone knows which tool and target the step will name. So it must pass every way the
    agent's ``policy`` can resolve (its own fields and each rule's), as every other vote
    must: the starter is in its groups; the policy lets the person who started a run
    approve it (``self_approval`` set to true: unset means "not for an irreversible
    effect", and the step may be one); and one person is enough (``required`` 1). The same
    rule judges a pre-approval again when the step uses it (``preapproval_stands``), so a
    policy made stricter since the start wins.
    """
    if user is None or not getattr(user, "is_authenticated", False):
        return NotAllowed(
            "not_a_person",
            gettext("A pre-approval is an approval: only a signed-in person gives one."),
        )
    policy = policy or {}
    base = {k: v for k, v in policy.items() if k != "rules"}
    variants = [base] + [
        {**base, **{k: v for k, v in rule.items() if k != "match"}}
        for rule in policy.get("rules") or []
    ]
    for fields in variants:
        groups = list(fields.get("groups") or [])
        if not _in_groups(user, groups):
            return NotAllowed(
                "not_in_group",
                gettext(
                    "Only members of %(groups)s may approve this agent's actions, and a "
                    "pre-approval is an approval."
                )
                % {"groups": ", ".join(groups)},
            )
        required = int(fields.get("required") or 1)
        if required > 1:
            return NotAllowed(
                "needs_more_approvers",
                gettext(
                    "This agent's approvals need %(n)s different people, and a pre-approval "
                    "is one person's. Start the run without it: the approvers decide when "
                    "the run asks."
                )
                % {"n": required},
            )
        if fields.get("self_approval") is not True:
            return NotAllowed(
                "self_approval",
                gettext(
                    "A pre-approval approves your own run, and this agent's approval policy "
                    "does not let the person who started a run approve it. Start the run "
                    "without it: someone else approves when the run asks."
                ),
            )
    return None


def preapproval_stands(run: Any) -> bool:
    """Whether the steps approved when ``run`` was started are still approved: the agent's
    policy as it is now still lets its starter pre-approve (``why_not_preapprove``)."""
    from runs.agents import approval_policy_for

    if not run.approvals or run.created_by_id is None:
        return False
    policy, _source = approval_policy_for(run.agent)
    return why_not_preapprove(policy, run.created_by) is None


def approvals_so_far(request: Any) -> list[Any]:
    """The approvals that count now (this round's, as each person last decided), oldest
    first."""
    if not request.decisions:
        return []
    return list(
        standing_votes(request)
        .select_related("user")
        .filter(decision="approve")
        .order_by("created_at", "id")
    )


def approvals_needed(request: Any) -> int:
    """How many more distinct approvals the request needs (0 once answered)."""
    from runs.states import RequestStatus

    if request.status != RequestStatus.PENDING:
        return 0
    return max(0, policy_of(request.policy)["required"] - len(approvals_so_far(request)))


def eligible_approvers(request: Any, *, limit: int = 50) -> list[Any]:
    """The people who may still approve ``request`` under its policy: active, holding the
    approve permission and the permission to see runs, in its groups (if it names any), not
    kept out by the self-approval rule, and not among this round's approvers. The card
    names them; notifications go to them."""
    from django.contrib.auth import get_user_model

    policy = policy_of(request.policy)
    people = get_user_model().objects
    users = people.with_perm("runs.approve_run", is_active=True).filter(
        pk__in=people.with_perm("runs.view_run", is_active=True).values("pk")
    )
    if policy["groups"]:
        users = users.filter(groups__name__in=policy["groups"])
    excluded: set[Any] = (
        set(standing_votes(request).filter(decision="approve").values_list("user_id", flat=True))
        if request.decisions
        else set()
    )
    if not policy["self_approval"]:
        excluded.add(getattr(request.run, "created_by_id", None))
        excluded.add(_last_answerer_id(request))
    excluded.discard(None)
    return list(users.exclude(pk__in=excluded).distinct().order_by("username")[:limit])
