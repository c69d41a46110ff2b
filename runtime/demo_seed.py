"""Demo accounts and demo runs for ``manage.py serve`` (``make run``).

``ensure_demo_accounts`` creates an operator, an approver, a viewer and an admin with
one generated password, printed once, at first start. ``seed_demo_runs`` starts one
run per dashboard state a newcomer should see, and ``DemoDriver`` answers for the
demo people until each run has reached its state:

- a question waiting for an answer (the token-version prompt);
- an approval waiting before the risky config change;
- a run backing off after a transient error;
- a run stopped on the same error repeated;
- a run stopped on a webhook whose outcome is unknown (reconcile it);
- a finished run with its side-effect report.

Nothing is seeded when the database already holds runs, so a second start keeps
the data and seeds nothing twice.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction

from runs import services
from runs.errors import HoldpointError
from runs.groups import ensure_default_groups
from runs.models import InputRequest, Run

logger = logging.getLogger(__name__)

DEMO_ACCOUNTS = {
    "operator": "operator",
    "approver": "approver",
    # A second approver: the demo's config change needs two (DEMO_POLICY).
    "reviewer": "approver",
    "viewer": "viewer",
    "admin": "admin",
}
# The demo's team rule (issue 18), as an operator would set it with ``manage.py agent
# policy``: a change to the config store needs two distinct approvers.
DEMO_POLICY = {"rules": [{"match": "config_store:*", "required": 2}]}


def ensure_demo_accounts(password: str | None = None) -> str | None:
    """Create the demo accounts; return their new password, or None if they existed."""
    if User.objects.filter(username__in=DEMO_ACCOUNTS).exists():
        return None
    password = password or secrets.token_urlsafe(9)
    ensure_default_groups()
    with transaction.atomic():
        for username, group in DEMO_ACCOUNTS.items():
            user = User.objects.create_user(
                username=username,
                # Notifications go to these (the console or file mail backend in the demo).
                email=f"{username}@example.com",
                password=password,
                is_staff=username == "admin",
                is_superuser=username == "admin",
            )
            user.groups.add(Group.objects.get(name=group))
    return password


@dataclass
class Scenario:
    """A demo run and what the demo people answer until it reaches its state."""

    title: str
    agent: str
    input: dict[str, Any]
    answers: list[str] = field(default_factory=list)  # "versions", "approve" in order
    run_id: str = ""


def demo_scenarios(receiver_url: str) -> list[Scenario]:
    notify = "platform-team@example.com"
    return [
        Scenario("A question waiting for an answer", "auth-token-migration", {"notify": notify}),
        Scenario(
            "An approval two people must give, the first one given, editable before approving",
            "auth-token-migration",
            {"notify": notify},
            answers=["versions", "approve-one"],
        ),
        Scenario("A run backing off after a transient error", "nightly-report", {}),
        Scenario(
            "A run stopped on a repeated error",
            "flaky-deploy",
            {"service": "checkout", "mode": "repeated"},
        ),
        Scenario(
            "A run with an unknown side effect to reconcile",
            "webhook-fanout",
            {
                "base_url": receiver_url,
                "event": "deploy.finished",
                "subscribers": ["billing", "search", "analytics"],
                "slow": "analytics",
                "slow_seconds": 30,
            },
        ),
        Scenario(
            "A finished run with its side-effect report",
            "auth-token-migration",
            {"notify": notify},
            answers=["versions", "approve", "approve"],
        ),
    ]


def seed_demo_runs(receiver_url: str) -> list[Scenario]:
    """Start the demo runs unless the database already has runs. Return what was started."""
    if Run.objects.exists():
        return []
    operator = User.objects.filter(username="operator").first()
    from runs.approvals import parse_policy
    from runs.models import AgentApprovalPolicy

    AgentApprovalPolicy.objects.get_or_create(
        agent="auth-token-migration", defaults={"policy": parse_policy(DEMO_POLICY)}
    )
    scenarios = demo_scenarios(receiver_url)
    for scenario in scenarios:
        run = services.run_start(
            agent=scenario.agent, input=scenario.input, user=operator, actor="user:operator"
        )
        scenario.run_id = run.id
    return scenarios


DEMO_APPROVERS = ("approver", "reviewer", "admin")


class DemoDriver(threading.Thread):
    """Answers the seeded runs' questions as the demo people would, then stops."""

    def __init__(self, scenarios: list[Scenario], stop: threading.Event, timeout: float = 120):
        super().__init__(name="demo-driver", daemon=True)
        self.scenarios = [s for s in scenarios if s.answers]
        self.stop_event = stop
        self.timeout = timeout

    def run(self) -> None:
        from django.db import connection

        deadline = time.monotonic() + self.timeout
        try:
            while self.scenarios and time.monotonic() < deadline and not self.stop_event.is_set():
                for scenario in list(self.scenarios):
                    if self._step(scenario):
                        self.scenarios.remove(scenario)
                self.stop_event.wait(0.3)
        finally:
            connection.close()

    @staticmethod
    def _approver(request: InputRequest) -> str | None:
        """The first demo approver the request's policy lets approve now."""
        from runs.approvals import why_not_decide

        for name in DEMO_APPROVERS:
            user = User.objects.filter(username=name).first()
            if user is not None and why_not_decide(request, user) is None:
                return name
        return None

    def _step(self, scenario: Scenario) -> bool:
        """Answer the run's open question if it is the next expected; True when done."""
        if not scenario.answers:
            return True
        run = Run.objects.get(pk=scenario.run_id)
        if run.pending_request_id is None:
            return False
        request = InputRequest.objects.get(pk=run.pending_request_id)
        expected = scenario.answers[0]
        if expected == "versions" and request.kind == "input_required":
            value: dict[str, Any] = {"versions": ["v2", "v3"]}
            who: str | None = "operator"
        elif expected in ("approve", "approve-one") and request.kind == "auth_required":
            value = {"decision": "approve", "comment": "Reviewed the diff; go ahead."}
            who = self._approver(request)
            if who is None:
                return False
        else:
            return False
        try:
            services.run_resume(
                run_id=run.id,
                request_id=request.id,
                checkpoint_id=request.checkpoint_id or "",
                value=value,
                user=User.objects.get(username=who),
            )
        except HoldpointError as exc:
            logger.warning("demo: could not answer %s: %s", request.id, exc.detail)
            return False
        request.refresh_from_db()
        if expected == "approve" and request.status == "pending":
            return False  # one of several approvals: the next demo approver gives the next
        scenario.answers.pop(0)
        return not scenario.answers
