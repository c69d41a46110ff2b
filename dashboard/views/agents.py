"""An agent's page: what it is, and the rules of the tools it calls through the MCP
gateway (docs/dashboard.md, "The agent page").

Each tool's card shows what the downstream server says of it (untrusted text, isolated),
what its annotations suggest, the rule in force and who confirmed it; a form per tool
sets the rule and its argument patterns (rows added and removed without JavaScript: the
"Add a pattern row" button posts the form back unsaved, a ticked "Remove" drops a row),
and "Confirm all suggestions" accepts every unconfirmed tool's suggestion. People without
``ledger.change_toolrule`` see the cards read-only. Every action goes through
``submit_action`` (the form's Idempotency-Key) to one service of
``ledger.services.tool_rules``.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_GET, require_POST

from dashboard.actions import (
    HtmxHttpRequest,
    Outcome,
    dashboard_view,
    new_idempotency_key,
    redirect_after_post,
    submit_action,
)
from dashboard.present import actor_name
from ledger.models import ToolRule, ToolRuleKind
from ledger.selectors import agent_known, tool_rules_for_user
from ledger.services import tool_rules as rules
from runs.access import Actor
from runs.audit import DASHBOARD
from runs.selectors import CHANGE_TOOL_RULES, agent_overview, permission_denied_text
from runs.services import session_identity

# Blank pattern rows a form shows besides the tool's patterns (more: "Add a pattern row").
BLANK_ROWS = 1

# The MCP annotations in words: (key, value) -> what the downstream server says.
HINTS = {
    ("readOnlyHint", True): gettext_lazy("Says it only reads"),
    ("readOnlyHint", False): gettext_lazy("Says it may change things"),
    ("destructiveHint", True): gettext_lazy("Says it may delete or overwrite"),
    ("destructiveHint", False): gettext_lazy("Says it only adds, never deletes or overwrites"),
    ("idempotentHint", True): gettext_lazy("Says repeating a call changes nothing more"),
    ("idempotentHint", False): gettext_lazy("Says repeating a call does it again"),
    ("openWorldHint", True): gettext_lazy("Says it reaches systems outside its server"),
    ("openWorldHint", False): gettext_lazy("Says it stays within its server"),
}

RULE_WORDS: dict[str, Any] = {
    ToolRuleKind.PASS: gettext_lazy("Pass (a read, not recorded)"),
    ToolRuleKind.RECORD: gettext_lazy("Record in the ledger, no approval"),
    ToolRuleKind.APPROVE: gettext_lazy("Ask for approval"),
}


def _hints(annotations: dict[str, Any]) -> list[str]:
    return [
        str(HINTS[(key, annotations[key])])
        for key in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
        if (key, annotations.get(key)) in HINTS
    ]


def _form_state(
    row: ToolRule,
    *,
    rule: str | None = None,
    patterns: list[dict[str, str]] | None = None,
    extra_rows: int = 0,
    error: str = "",
) -> dict[str, Any]:
    """What the tool's form shows: the rule and patterns in force (or what was typed),
    blank rows to add more, an error, and a fresh idempotency key."""
    shown = list(row.patterns if patterns is None and row.confirmed else patterns or [])
    blanks = [{"argument": "", "matches": "", "rule": ToolRuleKind.APPROVE}] * (
        BLANK_ROWS + extra_rows
    )
    rows = [{"n": n, **pattern} for n, pattern in enumerate([*shown, *blanks])]
    return {
        "rule": rule or row.rule or row.suggested,
        "rows": rows,
        "count": len(rows),
        "error": error,
        "key": new_idempotency_key(),
        "full": len(shown) >= rules.MAX_PATTERNS,
    }


def tool_card(row: ToolRule, *, user: Actor, form: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "row": row,
        "hints": _hints(row.annotations or {}),
        "title": (row.annotations or {}).get("title", ""),
        "suggested": RULE_WORDS.get(row.suggested, row.suggested),
        "in_force": RULE_WORDS.get(row.in_force, row.in_force),
        "confirmed_by": actor_name(row.confirmed_actor),
        "schema_text": json.dumps(row.input_schema, indent=2, ensure_ascii=False, sort_keys=True),
        "form": form or _form_state(row),
        "can_change": user.has_perm(CHANGE_TOOL_RULES),
    }


def agent_context(user: Actor, name: str) -> dict[str, Any]:
    rows = tool_rules_for_user(user=user, agent=name)
    overview = agent_overview(name)
    return {
        "agent": overview,
        "name": name,
        "cards": [tool_card(row, user=user) for row in rows],
        "unconfirmed": sum(1 for row in rows if not row.confirmed),
        "can_change": user.has_perm(CHANGE_TOOL_RULES),
        "who_may": permission_denied_text(CHANGE_TOOL_RULES),
        "confirm_all_key": new_idempotency_key(),
        "rule_choices": [(value, RULE_WORDS[value]) for value in ToolRuleKind.values],
        "max_patterns": rules.MAX_PATTERNS,
        "max_glob": rules.MAX_GLOB,
    }


@dashboard_view()
@require_GET
def agent_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    return render(request, "dashboard/agent_detail.html", agent_context(request.user, name))


def _patterns_from(post: Any) -> tuple[list[dict[str, str]], int]:
    """The pattern rows of a posted form, in order: filled rows not ticked "Remove" (a row
    with nothing typed is left out), and how many rows the form had."""
    try:
        count = min(int(post.get("pattern_rows", "0")), rules.MAX_PATTERNS + 5)
    except ValueError:
        count = 0
    patterns = []
    for n in range(max(count, 0)):
        argument = post.get(f"pattern-{n}-argument", "").strip()
        matches = post.get(f"pattern-{n}-matches", "").strip()
        if post.get(f"pattern-{n}-remove") or (not argument and not matches):
            continue
        patterns.append(
            {"argument": argument, "matches": matches, "rule": post.get(f"pattern-{n}-rule", "")}
        )
    return patterns, count


def _tool_row(user: Actor, name: str, pk: int) -> ToolRule:
    if not user.has_perm(CHANGE_TOOL_RULES):
        raise PermissionDenied(permission_denied_text(CHANGE_TOOL_RULES))
    row = next((r for r in tool_rules_for_user(user=user, agent=name) if r.pk == pk), None)
    if row is None:
        raise Http404("No such tool.")
    return row


def _card_reply(
    request: HtmxHttpRequest,
    name: str,
    card: dict[str, Any],
    *,
    status: int = 200,
    message: str = "",
    level: str = "success",
) -> HttpResponse:
    """htmx: the tool's card with the message in it. Without JavaScript: the whole page
    with that card as it was posted (typed values and errors kept)."""
    if request.htmx:
        return render(
            request,
            "dashboard/agent_detail.html#tool-card",
            {**agent_context(request.user, name), "card": card, "message": message, "level": level},
            status=status,
        )
    context = agent_context(request.user, name)
    context["cards"] = [card if c["row"].pk == card["row"].pk else c for c in context["cards"]]
    if message:
        context["card_message"] = {"pk": card["row"].pk, "text": message, "level": level}
    return render(request, "dashboard/agent_detail.html", context, status=status)


@dashboard_view()
@require_POST
def tool_rule_confirm(request: HtmxHttpRequest, name: str, pk: int) -> HttpResponse:
    """Set one tool's rule and patterns; or, for "Add a pattern row", show the form again
    with one more blank row and nothing saved."""
    row = _tool_row(request.user, name, pk)
    patterns, count = _patterns_from(request.POST)
    rule = request.POST.get("rule", "")
    if request.POST.get("action") == "add_row":
        # One row more than the form had: the rows typed, the blank ones, and a new one.
        extra = max(count - len(patterns) + 1 - BLANK_ROWS, 0)
        form = _form_state(row, rule=rule, patterns=patterns, extra_rows=extra)
        return _card_reply(request, name, tool_card(row, user=request.user, form=form))

    def confirm(data: dict[str, Any]) -> dict[str, Any]:
        rules.tool_rule_confirm(
            agent=name,
            server=row.server,
            tool=row.tool,
            rule=data["rule"],
            patterns=data["patterns"],
            seen_hash=data["seen_hash"] or None,
            user=request.user,
            via=DASHBOARD,
            identity=session_identity(request.session),
        )
        return {}

    def stale() -> HttpResponse:
        row.refresh_from_db()
        return _card_reply(
            request,
            name,
            tool_card(row, user=request.user),
            status=400,
            message=_("This form is out of date; here is the tool as it is now."),
            level="error",
        )

    done = submit_action(
        request,
        ids={"tool_rule": str(row.pk)},
        values={
            "rule": rule,
            "patterns": patterns,
            "seen_hash": request.POST.get("schema_hash", "")[:64],
        },
        perform=confirm,
        stale=stale,
    )
    if isinstance(done, HttpResponse):
        return done
    outcome: Outcome = done.outcome
    if outcome.ok:
        row.refresh_from_db()
        if not request.htmx:
            messages.success(
                request,
                _("Rule of %(tool)s confirmed: %(rule)s.")
                % {"tool": row.tool, "rule": RULE_WORDS[row.in_force]},
            )
            return redirect_after_post(reverse("agent-detail", args=[name]) + f"#tool-{row.pk}")
        return _card_reply(
            request,
            name,
            tool_card(row, user=request.user),
            message=_("Rule confirmed: %(rule)s.") % {"rule": RULE_WORDS[row.in_force]},
        )
    if outcome.code == "invalid_state":
        row.refresh_from_db()
        message = _("The tool changed since this page was shown. Look at it again, then confirm.")
        return _card_reply(
            request,
            name,
            tool_card(row, user=request.user),
            status=outcome.status,
            message=message,
            level="error",
        )
    # Invalid input: the form again as it was typed, with what is wrong and nothing saved.
    form = _form_state(
        row,
        rule=rule,
        patterns=patterns,
        extra_rows=max(count - len(patterns) - BLANK_ROWS, 0),
        error=outcome.detail,
    )
    return _card_reply(
        request,
        name,
        tool_card(row, user=request.user, form=form),
        status=outcome.status,
        message=_("Nothing was saved."),
        level="error",
    )


@dashboard_view()
@require_POST
def tool_rules_confirm_suggested(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Accept the suggestion of every tool nobody has confirmed yet."""
    if not request.user.has_perm(CHANGE_TOOL_RULES):
        raise PermissionDenied(permission_denied_text(CHANGE_TOOL_RULES))
    if not agent_known(name):
        raise Http404("No such agent.")
    back = reverse("agent-detail", args=[name])

    def confirm(data: dict[str, Any]) -> dict[str, Any]:
        done = rules.tool_rules_confirm_suggested(
            agent=name,
            user=request.user,
            via=DASHBOARD,
            identity=session_identity(request.session),
        )
        return {"count": len(done)}

    def stale() -> HttpResponse:
        messages.error(request, _("This form is out of date; please try again."))
        return redirect_after_post(back)

    done = submit_action(request, ids={"agent": name}, perform=confirm, stale=stale)
    if isinstance(done, HttpResponse):
        return done
    outcome = done.outcome
    if outcome.ok:
        count = int(outcome.extra.get("count", 0))
        messages.success(
            request,
            ngettext(
                "Confirmed the suggestion of %(n)s tool.",
                "Confirmed the suggestion of %(n)s tools.",
                count,
            )
            % {"n": count},
        )
    else:
        messages.error(request, outcome.detail)
    if request.htmx:
        return render(
            request,
            "dashboard/agent_detail.html#tool-rules",
            agent_context(request.user, name),
        )
    return redirect_after_post(back)
