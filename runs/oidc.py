"""Company sign-in with OpenID Connect: the provider's endpoints, what its claims may say,
and the authentication backend (docs/security.md, "Company sign-in").

mozilla-django-oidc runs the protocol: the authorization-code flow with state, nonce and
PKCE, the token request, the ID token's signature. What it leaves to its user, and this
module adds:

- the ID token's ``iss`` must be the configured issuer and its ``aud`` must name our client
  (``azp`` too when there are several audiences); ``exp`` and ``iat`` are required;
- the userinfo answer must be about the same ``sub`` as the ID token;
- people are found by ``iss`` + ``sub`` (``runs.models.OidcIdentity``), never by e-mail
  alone, and their mapped groups are recomputed at every sign-in
  (``runs.services.accounts.oidc_sign_in``);
- every claim is untrusted input: lengths are limited, odd values are dropped, group names
  the mapping does not know are ignored (``parse_claims``).

The endpoints come from the issuer's discovery document, read at the first sign-in and
kept for ``DISCOVERY_SECONDS``, unless settings name them. Nothing here reaches the
network while a password signs in or a session is loaded.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import jwt
import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.utils.translation import gettext
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from runs.permissions import user_with_permissions

logger = logging.getLogger("holdpoint.oidc")

BACKEND = "runs.oidc.OidcBackend"
DISCOVERY_SECONDS = 3600
# Claim limits: what a sane provider sends, far below what would hurt a row or a page.
MAX_SUBJECT = 255
MAX_EMAIL = 254
MAX_NAME = 150
MAX_GROUP_VALUES = 500
MAX_GROUP_VALUE = 255
# The settings that name the provider's endpoints, and the discovery document's names.
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": (
        "HOLDPOINT_OIDC_AUTHORIZATION_ENDPOINT",
        "authorization_endpoint",
    ),
    "OIDC_OP_TOKEN_ENDPOINT": ("HOLDPOINT_OIDC_TOKEN_ENDPOINT", "token_endpoint"),
    "OIDC_OP_USER_ENDPOINT": ("HOLDPOINT_OIDC_USERINFO_ENDPOINT", "userinfo_endpoint"),
    "OIDC_OP_JWKS_ENDPOINT": ("HOLDPOINT_OIDC_JWKS_URI", "jwks_uri"),
}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


class SignInRefused(Exception):
    """The provider vouched for a person, but Holdpoint will not sign them in; the message
    says why, in words for the sign-in page."""


def enabled() -> bool:
    return bool(getattr(settings, "HOLDPOINT_OIDC_ISSUER", ""))


def password_login_enabled() -> bool:
    return bool(getattr(settings, "HOLDPOINT_PASSWORD_LOGIN", True))


def provider_name() -> str:
    return str(getattr(settings, "HOLDPOINT_OIDC_NAME", "") or "your company account")


# --- Settings (read by config/env.py: env_oidc_issuer, env_group_map) -------------------------


def managed_groups() -> set[str]:
    """Every group the mapping can give: each is set at sign-in to exactly what the claims
    say. A group outside this set is never touched by a sign-in."""
    mapping: dict[str, list[str]] = getattr(settings, "HOLDPOINT_OIDC_GROUP_MAP", {})
    return {group for groups in mapping.values() for group in groups}


# --- The provider's endpoints -------------------------------------------------------------------

_discovered: dict[str, tuple[float, dict[str, Any]]] = {}
_discovery_lock = threading.Lock()


def discovery(issuer: str) -> dict[str, Any]:
    """The issuer's discovery document (OpenID Connect Discovery 1.0), kept for an hour. Its
    ``issuer`` must be exactly ours (§4.3), or a document from elsewhere could name another
    provider's endpoints."""
    with _discovery_lock:
        kept = _discovered.get(issuer)
        if kept is not None and kept[0] > time.monotonic():
            return kept[1]
    response = requests.get(
        issuer.rstrip("/") + "/.well-known/openid-configuration",
        timeout=float(settings.HOLDPOINT_OIDC_TIMEOUT),
        allow_redirects=False,
    )
    response.raise_for_status()
    document = response.json()
    if not isinstance(document, dict) or document.get("issuer") != issuer:
        raise SuspiciousOperation(
            f"The discovery document of {issuer!r} names another issuer: "
            f"{str(document.get('issuer') if isinstance(document, dict) else None)[:200]!r}."
        )
    with _discovery_lock:
        _discovered[issuer] = (time.monotonic() + DISCOVERY_SECONDS, document)
    return document


def forget_discovery() -> None:
    with _discovery_lock:
        _discovered.clear()


def endpoint(setting: str) -> str:
    """One of mozilla-django-oidc's ``OIDC_OP_*`` endpoints: from its Holdpoint setting when
    one is set, else from the issuer's discovery document."""
    ours, key = ENDPOINTS[setting]
    explicit = str(getattr(settings, ours, "") or "")
    if explicit:
        return explicit
    value = discovery(str(settings.HOLDPOINT_OIDC_ISSUER)).get(key)
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        raise SuspiciousOperation(f"The provider's discovery document has no {key}.")
    return value


# mozilla-django-oidc's names for Holdpoint's settings: ours are the one truth.
ALIASES = {
    "OIDC_RP_CLIENT_ID": "HOLDPOINT_OIDC_CLIENT_ID",
    "OIDC_RP_CLIENT_SECRET": "HOLDPOINT_OIDC_CLIENT_SECRET",
    "OIDC_RP_SIGN_ALGO": "HOLDPOINT_OIDC_SIGN_ALGO",
    "OIDC_RP_SCOPES": "HOLDPOINT_OIDC_SCOPES",
    "OIDC_TIMEOUT": "HOLDPOINT_OIDC_TIMEOUT",
    "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS": "HOLDPOINT_OIDC_REFRESH_SECONDS",
}


def oidc_setting(attr: str, *args: Any) -> Any:
    """mozilla-django-oidc's ``get_settings``: the endpoints resolved lazily, its names for
    our settings read from ours."""
    if attr in ENDPOINTS:
        return endpoint(attr)
    attr = ALIASES.get(attr, attr)
    if args:
        return getattr(settings, attr, args[0])
    try:
        return getattr(settings, attr)
    except AttributeError:
        raise ImproperlyConfigured(f"Setting {attr} not found") from None


# --- Claims -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claims:
    """What Holdpoint takes from a provider's claims, checked and cut to size."""

    issuer: str
    subject: str
    email: str = ""
    email_verified: bool = False
    username: str = ""
    first_name: str = ""
    last_name: str = ""
    groups: frozenset[str] = field(default_factory=frozenset)
    # Claim values of the groups claim that the mapping does not know (for the log only).
    ignored_groups: int = 0


def _text(value: Any, limit: int) -> str:
    """A claim as text: a string without control characters, at most ``limit`` long;
    anything else is no value."""
    if not isinstance(value, str) or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return ""
    return value.strip()[:limit]


def parse_claims(*, issuer: str, claims: dict[str, Any]) -> Claims:
    """Holdpoint's reading of the provider's claims. A subject that is missing, too long or
    not printable refuses the sign-in; any other odd value is dropped."""
    subject = claims.get("sub")
    if (
        not isinstance(subject, str)
        or not subject
        or len(subject) > MAX_SUBJECT
        or not subject.isprintable()
    ):
        raise SignInRefused(gettext("The identity provider sent no usable subject (sub)."))
    email = _text(claims.get("email"), MAX_EMAIL + 1)
    if len(email) > MAX_EMAIL or not _EMAIL.match(email):
        email = ""
    verified = claims.get("email_verified")
    mapping: dict[str, list[str]] = getattr(settings, "HOLDPOINT_OIDC_GROUP_MAP", {})
    values = claims.get(str(settings.HOLDPOINT_OIDC_GROUPS_CLAIM))
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list):
        values = []
    groups: set[str] = set()
    ignored = 0
    for value in values[:MAX_GROUP_VALUES]:
        if isinstance(value, str) and len(value) <= MAX_GROUP_VALUE and value in mapping:
            groups.update(mapping[value])
        else:
            ignored += 1
    username = _text(claims.get("preferred_username"), MAX_NAME) or email.split("@")[0]
    return Claims(
        issuer=issuer,
        subject=subject,
        email=email,
        email_verified=verified is True or verified == "true",
        username=username,
        first_name=_text(claims.get("given_name"), MAX_NAME),
        last_name=_text(claims.get("family_name"), MAX_NAME),
        groups=frozenset(groups),
        ignored_groups=ignored + max(0, len(values) - MAX_GROUP_VALUES),
    )


# --- The backend --------------------------------------------------------------------------------


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, with the checks it leaves out and Holdpoint's own rule
    for finding and updating people. Permissions are ModelBackend's (it is one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django makes every backend for every authenticate() and every session: no settings
        # that need the network here (the endpoints are read in authenticate()).
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = str(getattr(settings, "HOLDPOINT_OIDC_CLIENT_ID", ""))
        self.OIDC_RP_CLIENT_SECRET = str(getattr(settings, "HOLDPOINT_OIDC_CLIENT_SECRET", ""))
        self.OIDC_RP_SIGN_ALGO = str(getattr(settings, "HOLDPOINT_OIDC_SIGN_ALGO", "RS256"))
        self.OIDC_RP_IDP_SIGN_KEY = None

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        return oidc_setting(attr, *args)

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        if request is None or not enabled():
            return None
        # Only the callback (dashboard.views.oidc) hands over a nonce, taken from the session
        # with its state; a password form posted to a URL with ?code=…&state=… must never
        # make this backend redeem a code.
        if "nonce" not in kwargs or "password" in kwargs:
            return None
        if not request.GET.get("code") or not request.GET.get("state"):
            return None
        self.OIDC_OP_TOKEN_ENDPOINT = endpoint("OIDC_OP_TOKEN_ENDPOINT")
        self.OIDC_OP_USER_ENDPOINT = endpoint("OIDC_OP_USER_ENDPOINT")
        self.OIDC_OP_JWKS_ENDPOINT = endpoint("OIDC_OP_JWKS_ENDPOINT")
        return super().authenticate(request, **kwargs)

    def _verify_jws(self, payload: Any, key: Any) -> Any:
        """The signature (mozilla-django-oidc's check of the algorithm first), then what it
        leaves out: issuer, audience, expiry and issue time, all required."""
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation("The ID token is not signed with the expected algorithm.")
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=str(settings.HOLDPOINT_OIDC_ISSUER),
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
                leeway=60,
            )
        except jwt.InvalidIssuerError:
            raise SuspiciousOperation("The ID token comes from another issuer.") from None
        except jwt.PyJWTError as exc:
            raise SuspiciousOperation(f"The ID token was refused: {exc}.") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("The ID token was issued to another client (azp).")
        return claims

    def get_or_create_user(self, access_token: Any, id_token: Any, payload: Any) -> Any:
        from runs.services.accounts import oidc_sign_in

        userinfo = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload.get("sub"):
            # OpenID Connect Core 1.0 §5.3.2: the userinfo answer must be about the same
            # subject as the ID token, or it is not to be used.
            raise SuspiciousOperation("The userinfo answer is about another subject.")
        # The signed ID token wins where both say something.
        claims = {**userinfo, **payload}
        try:
            return oidc_sign_in(
                claims=parse_claims(issuer=str(settings.HOLDPOINT_OIDC_ISSUER), claims=claims)
            )
        except SignInRefused as refusal:
            self.request.holdpoint_oidc_refusal = str(refusal)
            logger.warning("OIDC sign-in refused: %s", refusal)
            return None

    def get_user(self, user_id: Any) -> Any:
        """As the lockout backend: the user with their permission set in one query."""
        user = user_with_permissions(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None


# --- The way to the provider --------------------------------------------------------------------

SESSION_EXPIRY = "oidc_id_token_expiration"  # mozilla-django-oidc's name
SESSION_NEXT = "oidc_login_next"


def authorization_url(request: Any, *, next_url: str | None, silent: bool = False) -> str:
    """The provider's authorization URL for a new sign-in from this session: a fresh state,
    nonce and PKCE verifier kept in the session (mozilla-django-oidc's store, which the
    callback checks), and where to go afterwards. ``silent`` asks the provider not to show
    anything (``prompt=none``): the confirmation of a session that is due for one."""
    from urllib.parse import urlencode

    from django.urls import reverse
    from django.utils.crypto import get_random_string
    from mozilla_django_oidc.utils import (
        add_state_and_verifier_and_nonce_to_session,
        generate_code_challenge,
    )

    state = get_random_string(32)
    params = {
        "response_type": "code",
        "scope": str(settings.HOLDPOINT_OIDC_SCOPES),
        "client_id": str(settings.HOLDPOINT_OIDC_CLIENT_ID),
        "redirect_uri": request.build_absolute_uri(reverse("oidc-callback")),
        "state": state,
        "nonce": get_random_string(32),
    }
    verifier = None
    if getattr(settings, "OIDC_USE_PKCE", True):
        verifier = get_random_string(64)
        params["code_challenge"] = generate_code_challenge(verifier, "S256")
        params["code_challenge_method"] = "S256"
    if silent:
        params["prompt"] = "none"
    add_state_and_verifier_and_nonce_to_session(request, state, params, verifier)
    request.session[SESSION_NEXT] = next_url
    return f"{endpoint('OIDC_OP_AUTHORIZATION_ENDPOINT')}?{urlencode(params)}"


def session_due(request: Any) -> bool:
    """Whether this request's session was signed in through the provider and is due to be
    confirmed with it again (``HOLDPOINT_OIDC_REFRESH_SECONDS`` after the last time)."""
    from django.contrib.auth import BACKEND_SESSION_KEY

    session = getattr(request, "session", None)
    if session is None or session.get(BACKEND_SESSION_KEY) != BACKEND:
        return False
    if not request.user.is_authenticated:
        return False
    return float(session.get(SESSION_EXPIRY) or 0) <= time.time()
