"""What a push rendered once for many sockets may know of the people it is for.

A ``Role`` is everyone with the same permissions; the parts of a page that depend on what
the user may do are rendered once per role and push (``live/hub.py``), and each socket then
fills in what must be its own (its CSRF token, fresh idempotency keys: ``personalize``).
"""

from __future__ import annotations

import io
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import (
    CSRF_ALLOWED_CHARS,
    CSRF_SECRET_LENGTH,
    CsrfViewMiddleware,
    get_token,
)

from dashboard.actions import new_idempotency_key


@dataclass(frozen=True)
class Role:
    """Everyone with the same permissions: what a render shared by their sockets may know.

    The parts of a page that depend on what a person may do (the cancel and retry forms,
    the question's card, the badge's count) are rendered once per role and push, not once
    per socket, for this ``runs.access.Actor``. It has permissions and nothing else (no
    name, no session; ``pk`` is None), so a fragment rendered for a role cannot carry
    anything of one person to another; what must be a person's own (the CSRF token,
    fresh idempotency keys) is filled in per socket (``personalize``).
    """

    perms: frozenset[str]
    superuser: bool = False

    is_authenticated = True
    pk = None

    def has_perm(self, perm: str, /) -> bool:
        return self.superuser or perm in self.perms


@dataclass(frozen=True)
class Person:
    """One signed-in person as a push sees them (a ``runs.access.Actor``): who they are
    (``pk``, for what is theirs: the requests they answered) and their ``Role``."""

    pk: Any
    role: Role

    is_authenticated = True

    def has_perm(self, perm: str, /) -> bool:
        return self.role.has_perm(perm)


NOBODY = Role(frozenset())


def live_request(scope: dict[str, Any]) -> HttpRequest:
    """A request that stands for the socket's page at this moment: its path, cookies and
    headers, and no user (whom a render is for is passed to it, a ``Person`` or a
    ``Role``).

    The CSRF token comes from the page's own cookie, so a pushed form posts like a
    rendered one; language and time zone come from the page's cookies and headers.
    """
    request = ASGIRequest({**scope, "type": "http", "method": "GET"}, io.BytesIO())
    CsrfViewMiddleware(lambda _request: HttpResponse()).process_request(request)
    return request


def role_request(request: HttpRequest) -> HttpRequest:
    """A request with nothing of the socket's person in it (no cookies, no headers, no
    query, no user): only its page's path, for a render shared by a role. Language and
    time zone are the render's."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": request.path,
        "root_path": getattr(request, "scope", {}).get("root_path", ""),
        "headers": [],
        "query_string": b"",
    }
    return ASGIRequest(scope, io.BytesIO())


# What a role's render leaves for each socket to fill in. The mark is secret and new in
# every process, so no text an agent sent (a prompt, a context item) can contain it.
_MARK = f"hp{secrets.token_hex(8)}"
_PERSONAL = re.compile(_MARK + r"-(csrf|key\d+)")


def personal(name: str) -> str:
    """A mark for a value that must be the socket's own: "csrf", or "key<n>" for a form's
    idempotency key (every socket gets its own, as every page render does)."""
    return f"{_MARK}-{name}"


def personalize(html: str, request: HttpRequest) -> str:
    """``html`` rendered for a role, made this socket's: the CSRF token of its own cookie
    (freshly masked, like a page's) and fresh idempotency keys."""
    if _MARK not in html:
        return html
    keys: dict[str, str] = {}

    def fill(match: re.Match[str]) -> str:
        if match[1] == "csrf":
            # One masked token per frame, as a page render has one (``{% csrf_token %}``).
            return keys.setdefault("csrf", masked_csrf_token(request))
        return keys.setdefault(match[1], new_idempotency_key())

    return _PERSONAL.sub(fill, html)


_CHARS = CSRF_ALLOWED_CHARS
_UNBIASED = 256 - 256 % len(_CHARS)  # bytes at or above this would favour some characters
_INDEX = {c: i for i, c in enumerate(_CHARS)}


def masked_csrf_token(request: HttpRequest) -> str:
    """``get_token(request)``: the socket's CSRF secret (its cookie's), freshly masked as
    Django masks it, from one read of the system's randomness instead of one per
    character (Django's ``get_random_string``; a hundred sockets per push)."""
    secret = request.META.get("CSRF_COOKIE", "")
    if len(secret) != CSRF_SECRET_LENGTH or any(c not in _INDEX for c in secret):
        return get_token(request)  # no cookie yet: Django makes one
    mask: list[str] = []
    while len(mask) < CSRF_SECRET_LENGTH:
        mask += [_CHARS[b % len(_CHARS)] for b in os.urandom(48) if b < _UNBIASED]
    mask = mask[:CSRF_SECRET_LENGTH]
    cipher = "".join(
        _CHARS[(_INDEX[x] + _INDEX[y]) % len(_CHARS)] for x, y in zip(secret, mask, strict=True)
    )
    return "".join(mask) + cipher
