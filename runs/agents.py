"""What the run store knows about agents: names, input schemas and retry policies.

Python agents are registered here by ``runtime`` at start-up (dependencies point
``runtime -> runs``); agents served by HTTP workers in other languages are
``DeclaredAgent`` rows. ``agent_spec(name)`` finds either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# The retry policy is the agent SDK's (``holdpoint_client/types.py``): one definition for
# the server, the remote clients and the harness; the run store judges failures by it.
from holdpoint_client.types import RetryPolicy as RetryPolicy

from runs.errors import HoldpointError


@dataclass(frozen=True)
class AgentSpec:
    name: str
    input_schema: dict[str, Any] = field(default_factory=dict)
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)
    tools: tuple[str, ...] = ()
    description: str = ""
    source: str = "python"
    # A template over the run's input, e.g. "Migrate {service}" (see ``run_label``).
    label: str = ""
    # Per-step retry policies (``@agent.step(retry=…)``): they replace the agent's policy
    # for the failures of that step.
    step_retry: dict[str, RetryPolicy] = field(default_factory=dict)

    def policy_for(self, step: str) -> RetryPolicy:
        """The retry policy that judges a failure of ``step``."""
        return self.step_retry.get(step) or self.retry_policy

    # Who may approve, and how many (``runs/approvals.py``, ``parse_policy``).
    approval_policy: dict[str, Any] = field(default_factory=dict)

    # A declared agent's current version (None for a Python agent).
    version: int | None = None


_registry: dict[str, AgentSpec] = {}


def register_agent_spec(spec: AgentSpec) -> None:
    _registry[spec.name] = spec


def unregister_agent_spec(name: str) -> None:
    _registry.pop(name, None)


def python_agent_specs() -> list[AgentSpec]:
    return sorted(_registry.values(), key=lambda s: s.name)


def agent_spec(name: str) -> AgentSpec:
    """Return the spec of a registered or declared agent, or raise ``unknown_agent``."""
    spec = _registry.get(name)
    if spec is not None:
        return spec
    from runs.models import DeclaredAgent

    declared = DeclaredAgent.objects.filter(name=name).first()
    if declared is None:
        raise HoldpointError("unknown_agent", f"There is no agent named {name!r}.", agent=name)
    return AgentSpec(
        name=declared.name,
        input_schema=declared.input_schema or {},
        retry_policy=RetryPolicy.from_dict(declared.retry_policy or {}),
        tools=tuple(declared.tools or ()),
        description=declared.description,
        source="declared",
        label=declared.label,
        version=declared.version,
    )


def approval_policy_for(name: str) -> tuple[dict[str, Any], str]:
    """An agent's approval policy and where it comes from: an operator's (``manage.py
    agent policy``, stored) wins over the agent's code (SDK ``approval_policy=``);
    ``("{}", "default")`` when neither gives one."""
    from runs.models import AgentApprovalPolicy

    stored = AgentApprovalPolicy.objects.filter(agent=name).values_list("policy", flat=True).first()
    if stored is not None:
        return dict(stored), "operator"
    spec = _registry.get(name)
    if spec is not None and spec.approval_policy:
        return dict(spec.approval_policy), "code"
    if spec is None:
        from runs.models import DeclaredAgent

        declared = (
            DeclaredAgent.objects.filter(name=name)
            .values_list("approval_policy", flat=True)
            .first()
        )
        # What a remote agent declared (PUT /api/agents/{name}); ``ask_before`` is its
        # client's business, not who may decide.
        team = {k: v for k, v in (declared or {}).items() if k != "ask_before"}
        if team:
            return team, "code"
    return {}, "default"


def all_agent_specs() -> list[AgentSpec]:
    from runs.models import DeclaredAgent

    specs = {s.name: s for s in python_agent_specs()}
    for declared in DeclaredAgent.objects.order_by("name"):
        specs.setdefault(declared.name, agent_spec(declared.name))
    return sorted(specs.values(), key=lambda s: s.name)


LABEL_MAX = 80
LABEL_TEMPLATE_MAX = 200
# The label templates of declared agents (PUT /api/agents/{name}), read at most this often
# per process: labels are drawn for every row of a list, and must not cost a query each.
DECLARED_LABELS_TTL = 30.0
_declared_labels: dict[str, str] = {}
_declared_labels_at = -DECLARED_LABELS_TTL


def declared_label(agent: str) -> str:
    """The label template of a declared agent ("" when it has none), cached per process."""
    import time

    global _declared_labels, _declared_labels_at
    now = time.monotonic()
    if now - _declared_labels_at >= DECLARED_LABELS_TTL:
        from django.db import DatabaseError

        from runs.models import DeclaredAgent

        try:
            _declared_labels = dict(
                DeclaredAgent.objects.exclude(label="").values_list("name", "label")
            )
        except DatabaseError:
            return ""
        _declared_labels_at = now
    return _declared_labels.get(agent, "")


def forget_declared_labels() -> None:
    """Read the declared labels again at the next label (a declaration just changed one)."""
    global _declared_labels_at
    _declared_labels_at = -DECLARED_LABELS_TTL


# A label template is literal text and ``{field}`` names of the input's top-level fields:
# no format specs, conversions, attributes or indexes (``{note:>4000000}`` would allocate
# gigabytes, ``{note.__class__}`` would read Python internals), so it is filled by this
# pattern, never by ``str.format``.
_LABEL_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,99})\}")
_LABEL_BRACES = re.compile(r"[{}]")


def label_template_problem(template: str) -> str | None:
    """Why ``template`` is not a label template (a sentence), or None when it is one:
    at most 200 characters, literal text and ``{field}`` names only."""
    if not isinstance(template, str) or len(template) > LABEL_TEMPLATE_MAX:
        return f"a label is a text of at most {LABEL_TEMPLATE_MAX} characters"
    if _LABEL_BRACES.search(_LABEL_FIELD.sub("", template)):
        return (
            "a label is text with {field} names of the input only (no format specs, "
            "attributes or indexes), e.g. 'Triage {ticket}'"
        )
    return None


def run_label(agent: str, input: Any, run_id: str) -> str:
    """A run's human label: the agent's label template filled from the input (``Migrate
    auth-gateway``), else the agent's name and a short id (``deploy · 7GQ2KD``).

    Python agents registered in this process are consulted, and declared agents through a
    per-process cache (``declared_label``: no query per row). A template that does not fit
    the input (a field missing, or not a label template: ``label_template_problem``) falls
    back to the default; filling one never fails and never takes more than the label's
    length.
    """
    short = run_id.rsplit("_", 1)[-1][-6:]
    spec = _registry.get(agent)
    label = spec.label if spec is not None else declared_label(agent)
    if label and isinstance(input, dict) and label_template_problem(label) is None:
        missing = False

        def fill(match: re.Match[str]) -> str:
            nonlocal missing
            value = input.get(match.group(1))
            if value is None:
                missing = True
                return ""
            text = value if isinstance(value, str) else str(value)
            return text[: LABEL_MAX + 1]

        text = " ".join(_LABEL_FIELD.sub(fill, label).split())
        if text and not missing:
            return text if len(text) <= LABEL_MAX else text[: LABEL_MAX - 1] + "…"
    return f"{agent} · {short}"
