"""People who sign in through the company's identity provider (runs/oidc.py).

``oidc_sign_in`` is the one writer of ``OidcIdentity`` rows and of the memberships the
group mapping manages. Its rules (docs/security.md, "Company sign-in"):

- A person is found by the provider's ``iss`` + ``sub``. E-mail alone never finds anyone.
- A first sign-in creates a new account, unless a local account already has the same
  e-mail: then the sign-in is refused (no silent takeover), except when
  ``HOLDPOINT_OIDC_LINK_BY_EMAIL`` is on, the provider says the e-mail is verified, exactly
  one account has it, that account is linked to no other identity and is neither staff
  nor superuser. An administrator can link any account by hand (the admin's OpenID
  Connect identities).
- At every sign-in the groups the mapping manages are set to exactly those the claims
  map to; other groups (given by hand) stay as they are. ``is_staff`` and
  ``is_superuser`` are never given or taken by a sign-in.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from runs.models import OidcIdentity
from runs.oidc import Claims, SignInRefused, managed_groups

logger = logging.getLogger("holdpoint.oidc")

_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]")


def _free_username(claims: Claims) -> str:
    """A username for a new account: the provider's preferred name when it is free, else
    that name with a short digest of the identity (usernames are shown, never matched)."""
    User = get_user_model()
    base = _USERNAME_UNSAFE.sub("", claims.username)[:120] or "user"
    if not User._default_manager.filter(username__iexact=base).exists():
        return base
    digest = hashlib.sha256(f"{claims.issuer}\n{claims.subject}".encode()).hexdigest()
    for length in (8, 16, 32):
        candidate = f"{base}-{digest[:length]}"
        if not User._default_manager.filter(username__iexact=candidate).exists():
            return candidate
    raise SignInRefused(_("No free username could be found for this account."))


def _linkable(claims: Claims, settings_link: bool) -> Any:
    """The existing account a first sign-in takes over, None to create a new one; refuses
    when an account has this e-mail but may not be linked."""
    if not claims.email:
        return None
    User = get_user_model()
    same = list(User._default_manager.filter(email__iexact=claims.email)[:2])
    if not same:
        return None
    refusal = SignInRefused(
        _(
            "An account with this e-mail address already exists in Holdpoint. "
            "Ask an administrator to link it to your company sign-in."
        )
    )
    if not settings_link or not claims.email_verified or len(same) > 1:
        raise refusal
    user = same[0]
    if user.is_staff or user.is_superuser or OidcIdentity.objects.filter(user=user).exists():
        raise refusal
    return user


@transaction.atomic(durable=True)
def oidc_sign_in(*, claims: Claims) -> Any:
    """Return the account of the person ``claims`` name, created or linked at their first
    sign-in, with the managed groups recomputed from the claims. Raises ``SignInRefused``."""
    from django.conf import settings

    User = get_user_model()
    # The identity row is locked so two sign-ins of one person (two tabs) recompute the
    # groups one after the other, never interleaved.
    identity = (
        OidcIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=claims.issuer, subject=claims.subject)
        .first()
    )
    if identity is None:
        user = _linkable(claims, bool(getattr(settings, "HOLDPOINT_OIDC_LINK_BY_EMAIL", False)))
        linked = user is not None
        if user is None:
            # No password: create_user stores an unusable one, so this account signs in
            # through the provider only.
            user = User._default_manager.create_user(
                username=_free_username(claims), email=claims.email
            )
        try:
            with transaction.atomic():
                identity = OidcIdentity.objects.create(
                    user=user, issuer=claims.issuer, subject=claims.subject
                )
        except IntegrityError:
            # The same person's first sign-in in another tab won the race: sign in as it.
            raise SignInRefused(
                _("This sign-in raced another one; please sign in again.")
            ) from None
        logger.info(
            "OIDC: %s %s for %s at %s",
            "linked" if linked else "created",
            user.get_username(),
            claims.subject,
            claims.issuer,
        )
    user = identity.user
    if not user.is_active:
        raise SignInRefused(_("This Holdpoint account is turned off."))
    # The profile from the provider (what people see), never the username (what they are
    # known by in the history).
    changed = False
    for attr, value in (
        ("email", claims.email),
        ("first_name", claims.first_name),
        ("last_name", claims.last_name),
    ):
        if value and getattr(user, attr) != value:
            setattr(user, attr, value)
            changed = True
    if changed:
        user.save(update_fields=["email", "first_name", "last_name"])
    before, after = _set_managed_groups(user, claims.groups)
    identity.last_sign_in_at = timezone.now()
    identity.mapped_groups = sorted(claims.groups)
    identity.save(update_fields=["last_sign_in_at", "mapped_groups"])
    if before != after or claims.ignored_groups:
        logger.info(
            "OIDC: %s signed in; managed groups %s -> %s; %d claim value(s) not mapped",
            user.get_username(),
            sorted(before),
            sorted(after),
            claims.ignored_groups,
        )
    return user


def _set_managed_groups(user: Any, wanted: frozenset[str]) -> tuple[set[str], set[str]]:
    """Set ``user``'s memberships of the managed groups to exactly ``wanted``; other groups
    stay. A mapped group that does not exist yet (an approval policy's group) is created,
    with no permissions."""
    managed = managed_groups()
    wanted_names = set(wanted) & managed
    current = set(user.groups.filter(name__in=managed).values_list("name", flat=True))
    remove = current - wanted_names
    add = wanted_names - current
    if remove:
        user.groups.remove(*Group.objects.filter(name__in=remove))
    if add:
        groups = [Group.objects.get_or_create(name=name)[0] for name in sorted(add)]
        user.groups.add(*groups)
    return current, wanted_names
