"""Small readers for settings taken from the environment.

Each one raises ``ImproperlyConfigured`` with a message that names the variable
and says what a good value looks like, so a typo fails at start-up instead of
turning into odd behaviour later (healthchecks' ``envbool``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from runs.rates import parse_rate

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off."
    )


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    return _env_number(name, default, int, "a whole number", minimum)


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    return _env_number(name, default, float, "a number", minimum)


Number = TypeVar("Number", int, float)


def _env_number(
    name: str, default: Number, parse: Callable[[str], Number], what: str, minimum: Number | None
) -> Number:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not {what}.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is too small; it must be at least {minimum}.")
    return value


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default or [])
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_destinations(name: str) -> list[str]:
    """A comma-separated allow list of host names, ``*.suffix`` names, addresses and CIDRs
    (``hooks.example.com, *.corp.example, 203.0.113.0/24``)."""
    from ledger.outbound import parse_allow_entry

    entries = env_list(name)
    for entry in entries:
        try:
            parse_allow_entry(entry)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{name}: {exc}; use host names, *.example.com, addresses or CIDRs "
                "separated by commas."
            ) from None
    return entries


def env_host_headers(name: str) -> dict[str, dict[str, str]]:
    """A JSON object of host name -> {header: value}: ``{"hooks.example.com":
    {"Authorization": "Bearer …"}}``."""
    import json

    from ledger.outbound import check_headers
    from ledger.tools import ActionFailed

    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} is not JSON.") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(
            f'{name} must be a JSON object: {{"host": {{"Header": "value"}}}}.'
        )
    parsed: dict[str, dict[str, str]] = {}
    for host, headers in value.items():
        try:
            parsed[str(host).lower().rstrip(".")] = check_headers(headers)
        except ActionFailed as exc:  # a bad name or value, said in its message
            raise ImproperlyConfigured(f"{name}[{host!r}]: {exc}") from None
    return parsed


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of: {', '.join(choices)}.")
    return value


def env_rate(name: str, default: str) -> str:
    """A rate (``600/min``, ``5/15min``, ``off``) checked now, kept as written."""
    value = os.environ.get(name, default).strip()
    try:
        parse_rate(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}.") from None
    return value


def parse_database_url(
    url: str, *, pool_size: int = 0, pool_timeout: float = 10.0
) -> dict[str, object]:
    """Turn ``postgres://user:pass@host:port/name?opt=v`` into a Django DATABASES entry.

    ``pool_size`` > 0 turns on psycopg's connection pool (Django 5.1+) with that many
    connections at most; a request waits ``pool_timeout`` seconds for one, then fails.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {parts.scheme!r} is not supported; use "
            "postgres://USER:PASSWORD@HOST:PORT/NAME, or unset DATABASE_URL for SQLite."
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured(
            "DATABASE_URL has no database name; use postgres://USER@HOST:PORT/NAME."
        )
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured(f"DATABASE_URL has a bad port: {url!r}.") from None
    options: dict[str, object] = dict(parse_qsl(parts.query))
    if pool_size > 0:
        options["pool"] = {"min_size": 1, "max_size": pool_size, "timeout": pool_timeout}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
        "OPTIONS": options,
        "CONN_MAX_AGE": 0,
        "ATOMIC_REQUESTS": False,
    }


def env_group_urls(name: str) -> dict[str, str]:
    """Comma-separated ``group=url`` pairs (``approver=https://hooks.slack.com/…``): the
    webhook each group's notifications go to (http or https)."""
    found: dict[str, str] = {}
    for entry in env_list(name):
        group, _, url = entry.partition("=")
        group, url = group.strip(), url.strip()
        if not group or not url.startswith(("https://", "http://")):
            raise ImproperlyConfigured(
                f"{name}: {entry!r} is not group=url; use e.g. approver=https://hooks.example.com/x."
            )
        found[group] = url
    return found


def env_group_channels(name: str) -> dict[str, str]:
    """Comma-separated ``group=channel`` pairs (``approver=C0123ABCD``): the Slack channel
    (its id) each group's requests are posted to."""
    found: dict[str, str] = {}
    for entry in env_list(name):
        group, _, channel = entry.partition("=")
        group, channel = group.strip(), channel.strip()
        if not group or not re.fullmatch(r"[A-Z0-9]{2,40}", channel):
            raise ImproperlyConfigured(
                f"{name}: {entry!r} is not group=channel; use e.g. approver=C0123ABCD "
                "(the channel's id, not its name)."
            )
        found[group] = channel
    return found


def env_oidc_issuer(name: str) -> str:
    """An OpenID Connect issuer: an https URL without query or fragment, kept exactly as
    written (it must equal the ``iss`` of the provider's ID tokens, trailing slash and all);
    http only for a loopback host (a provider on the same machine, the tests)."""
    issuer = os.environ.get(name, "").strip()
    if not issuer:
        return ""
    parts = urlsplit(issuer)
    loopback = parts.hostname in {"localhost", "127.0.0.1", "::1"}
    if (
        parts.scheme not in {"https", "http"}
        or (parts.scheme == "http" and not loopback)
        or not parts.hostname
        or parts.query
        or parts.fragment
    ):
        raise ImproperlyConfigured(
            f"{name}={issuer!r} must be the provider's issuer URL, https://… "
            "(e.g. https://login.example.com/realms/staff), exactly as its ID tokens say it."
        )
    return issuer


def env_group_map(name: str) -> dict[str, list[str]]:
    """Claim value -> Holdpoint groups: a JSON object (``{"hp-ops": "operator",
    "cn=Fin,ou=g": ["approver", "finance"]}``), or comma-separated ``value=group`` pairs
    (split at the last ``=``; a value may repeat to give several groups)."""
    import json

    raw = os.environ.get(name, "").strip()
    found: dict[str, list[str]] = {}
    if not raw:
        return found
    pairs: list[tuple[str, object]] = []
    if raw.startswith("{"):
        try:
            value = json.loads(raw)
        except ValueError:
            raise ImproperlyConfigured(f"{name} is not JSON.") from None
        if not isinstance(value, dict):
            raise ImproperlyConfigured(f'{name} must be a JSON object: {{"claim value": "group"}}.')
        for claim, groups in value.items():
            for group in groups if isinstance(groups, list) else [groups]:
                pairs.append((str(claim), group))
    else:
        for entry in raw.split(","):
            if not entry.strip():
                continue
            claim, sep, group = entry.rpartition("=")
            if not sep:
                raise ImproperlyConfigured(
                    f"{name}: {entry.strip()!r} is not value=group; use e.g. hp-approvers=approver."
                )
            pairs.append((claim.strip(), group.strip()))
    for claim, group in pairs:
        if not claim or not isinstance(group, str) or not group.strip() or len(group) > 150:
            raise ImproperlyConfigured(
                f"{name}: {claim!r} must map to a group name (1 to 150 characters)."
            )
        groups_of_claim = found.setdefault(claim, [])
        if group.strip() not in groups_of_claim:
            groups_of_claim.append(group.strip())
    return found
