"""Small helpers that drive a run through the real services into a given state."""

from __future__ import annotations

from typing import Any

from runs import services
from runs.models import Run
from runs.services import Lease

AGENT = "test-agent"


def preapprover() -> Any:
    """A person who may approve steps at start (an admin): approvals given at start are
    an approval, so a run started with them is started by such a person."""
    from django.contrib.auth.models import Group, User

    from runs.groups import ensure_default_groups

    ensure_default_groups()
    user, created = User.objects.get_or_create(username="ada")
    if created:
        user.groups.add(Group.objects.get(name="admin"))
    return user


def allow_preapproval(agent: str = AGENT) -> None:
    """Let the person who starts a run of ``agent`` approve its steps at start: a
    pre-approval is the starter's vote on their own run (``runs.approvals
    .why_not_preapprove``), so the agent's policy must allow self-approval. Set as an
    operator would (``manage.py agent policy --self-approval yes``), unless the test set a
    policy itself."""
    from runs.models import AgentApprovalPolicy

    AgentApprovalPolicy.objects.get_or_create(
        agent=agent, defaults={"policy": {"self_approval": True}}
    )


def start(**kwargs: Any) -> Run:
    if kwargs.get("approvals"):
        allow_preapproval()
        if "user" not in kwargs:
            kwargs["user"] = preapprover()
    return services.run_start(agent=AGENT, input=kwargs.pop("input", {"n": 1}), **kwargs)


def claim(worker: str = "w1", lease_seconds: float | None = None) -> Lease:
    lease = services.attempt_claim(worker_id=worker, lease_seconds=lease_seconds)
    assert lease is not None, "expected a due attempt to claim"
    return lease


def epochs(lease: Lease) -> dict[str, Any]:
    return {
        "attempt_id": lease.attempt_id,
        "lease_epoch": lease.lease_epoch,
        "cancel_epoch": lease.cancel_epoch,
    }


def interrupted(
    kind: str = "input_required",
    schema: Any = None,
    expires_in: float = 3600,
    started_by: Any = None,
    **kw: Any,
) -> tuple[Run, Lease, Any, Any]:
    """A run waiting for input: (run, lease, checkpoint, request); ``started_by`` is the
    person who started the run (none: the system)."""
    run = start() if started_by is None else start(user=started_by)
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={"seen": 1})
    extra: dict[str, Any] = {}
    if kind == "auth_required" and "action" not in kw:
        extra["action"] = {"tool": "config_store", "target": "staging/auth/config"}
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind=kind,
        prompt="请选择需要保持兼容的 Token 版本",
        accepted_schema=schema if schema is not None else {"versions": "string[]"},
        expires_in=expires_in,
        **extra,
        **kw,
    )
    run.refresh_from_db()
    return run, lease, cp, request


def snapshot(run_id: str) -> dict[str, Any]:
    """Everything a refused call must leave unchanged."""
    from runs.models import Attempt, Checkpoint, InputRequest, RunEvent

    run = Run.objects.get(pk=run_id)
    return {
        "run": {
            f.attname: getattr(run, f.attname)
            for f in Run._meta.concrete_fields
            if f.attname != "updated_at"
        },
        "attempts": list(Attempt.objects.filter(run_id=run_id).order_by("number").values()),
        "checkpoints": list(Checkpoint.objects.filter(run_id=run_id).values_list("id", flat=True)),
        "requests": list(InputRequest.objects.filter(run_id=run_id).order_by("id").values()),
        "events": list(RunEvent.objects.filter(run_id=run_id).values_list("seq", "type")),
    }
