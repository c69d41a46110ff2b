"""Whom a selector or a page answers for: the one interface the run store and the web apps
agree on for "who is this, and what may they do".

Django's users (and ``AnonymousUser``) satisfy it as they are. The live dashboard renders
one fragment for everyone with the same permissions, for a ``Role`` that satisfies it
too (``live/roles.py``), instead of standing in for a user: it has no name, no session
and no private Django attributes, so a fragment rendered for it cannot carry anything of
one person to another.
"""

from __future__ import annotations

from typing import Any, Protocol


class Actor(Protocol):
    """Signed in or not, who (``pk``; ``None`` for a role shared by many people), and
    which permissions ("runs.cancel_run") they hold."""

    @property
    def is_authenticated(self) -> bool: ...

    @property
    def pk(self) -> Any: ...

    def has_perm(self, perm: str, /) -> bool: ...
