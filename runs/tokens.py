"""Worker tokens: created, scoped and revoked here, checked by ``api/authentication.py``.

A worker token is ``hpw_`` and a random secret; only its SHA-256 is stored, so the secret is
shown once, when it is created (``manage.py workertoken create NAME``).

What a token may serve is decided here once (``serving_for``): its scope (the agents it
was created for; none: any), and never a declared agent that other tokens own (an agent
belongs to the token that first declared it, ``DeclaredAgent.owners``). The claim, the
declaration and the side-effect outcome all ask it.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.models import WorkerToken

TOKEN_PREFIX = "hpw_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@transaction.atomic
def worker_token_create(*, name: str, agents: Any = ()) -> tuple[WorkerToken, str]:
    """Create a token named ``name``, scoped to ``agents`` (empty: any agent); return the
    row and the secret (shown once, never stored)."""
    scope = check_scope(list(agents))
    if WorkerToken.objects.filter(name=name, revoked_at__isnull=True).exists():
        raise ValueError(f"An active worker token named {name!r} exists; revoke it first.")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = WorkerToken.objects.create(
        name=name,
        token_hash=hash_token(secret),
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        agents=scope,
    )
    return token, secret


# Bumped by every revocation or change of scope in this process: the worker API's authentication cache
# (api/authentication.py) forgets every token it holds when it changes, so a revocation is
# honoured at once by the process that made it, and by the others within the cache's
# lifetime (HOLDPOINT_WORKER_TOKEN_CACHE_SECONDS).
revocations = 0


def tokens_changed() -> None:
    """Note that tokens were revoked or rescoped in this process (see ``revocations``)."""
    global revocations
    revocations += 1


def worker_token_revoke(*, name: str) -> int:
    """Revoke the active token named ``name``; return how many were revoked (0 or 1)."""
    revoked = WorkerToken.objects.filter(name=name, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    tokens_changed()
    return revoked


# --- What a token may serve ----------------------------------------------------------------------

MAX_SCOPE = 200


@dataclass(frozen=True)
class Serving:
    """Which agents a worker token may serve: claim their runs, declare them, report on
    their side effects. ``allowed`` is the token's scope (None: any agent), ``excluded``
    the declared agents other tokens own. Read once per request (``serving_for``)."""

    token: str
    allowed: tuple[str, ...] | None
    excluded: frozenset[str]

    def why_not(self, agent: str) -> str | None:
        """Why the token may not serve ``agent`` (a sentence), or None when it may."""
        if self.allowed is not None and agent not in self.allowed:
            return (
                f"Worker token {self.token!r} is scoped to {', '.join(self.allowed)}; "
                f"{agent!r} is not among them."
            )
        if agent in self.excluded:
            return (
                f"Agent {agent!r} belongs to other worker tokens; an administrator can add "
                f"{self.token!r} to its owners (manage.py agent owners {agent} --add {self.token})."
            )
        return None


def serving_for(token: WorkerToken) -> Serving:
    """What ``token`` may serve: its scope, minus the declared agents other tokens own
    (one query)."""
    from runs.models import DeclaredAgent

    owned = DeclaredAgent.objects.exclude(owners=[]).values_list("name", "owners")
    excluded = frozenset(name for name, owners in owned if token.name not in (owners or []))
    scope = tuple(token.agents) if token.agents else None
    return Serving(token=token.name, allowed=scope, excluded=excluded)


def check_scope(agents: Any) -> list[str]:
    """A token's scope checked: a list of agent names (letters, digits, - and _)."""
    import re

    names = [agents] if isinstance(agents, str) else agents
    if not isinstance(names, list | tuple) or len(names) > MAX_SCOPE:
        raise ValueError(f"the scope is a list of at most {MAX_SCOPE} agent names")
    cleaned = [str(n).strip() for n in names if str(n).strip()]
    bad = [n for n in cleaned if not re.fullmatch(r"[-a-zA-Z0-9_]{1,100}", n)]
    if bad:
        raise ValueError(f"not agent names: {', '.join(bad)}")
    return list(dict.fromkeys(cleaned))


def worker_token_scope(*, name: str, agents: Any) -> WorkerToken:
    """Set the scope of the active token ``name`` (an empty list: any agent)."""
    token = WorkerToken.objects.filter(name=name, revoked_at__isnull=True).first()
    if token is None:
        raise ValueError(f"There is no active worker token named {name!r}.")
    token.agents = check_scope(agents)
    token.save(update_fields=["agents"])
    tokens_changed()
    return token
