"""Worker tokens: created and revoked here, checked by ``api/authentication.py``.

A worker token is ``hpw_`` and a random secret; only its SHA-256 is stored, so the secret is
shown once, when it is created (``manage.py workertoken create NAME``).
"""

from __future__ import annotations

import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from runs.models import WorkerToken

TOKEN_PREFIX = "hpw_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@transaction.atomic
def worker_token_create(*, name: str) -> tuple[WorkerToken, str]:
    """Create a token named ``name``; return the row and the secret (shown once, never stored)."""
    if WorkerToken.objects.filter(name=name, revoked_at__isnull=True).exists():
        raise ValueError(f"An active worker token named {name!r} exists; revoke it first.")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = WorkerToken.objects.create(
        name=name, token_hash=hash_token(secret), prefix=secret[: len(TOKEN_PREFIX) + 6]
    )
    return token, secret


def worker_token_revoke(*, name: str) -> int:
    """Revoke the active token named ``name``; return how many were revoked (0 or 1)."""
    return WorkerToken.objects.filter(name=name, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
