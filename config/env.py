"""Small readers for settings taken from the environment.

Each one raises ``ImproperlyConfigured`` with a message that names the variable
and says what a good value looks like, so a typo fails at start-up instead of
turning into odd behaviour later (healthchecks' ``envbool``).
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

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
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is too small; it must be at least {minimum}.")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is too small; it must be at least {minimum}.")
    return value


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default or [])
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = os.environ.get(name, default).strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be one of: {', '.join(choices)}.")
    return value


_RATE_UNITS = {
    "s": 1, "sec": 1, "second": 1,
    "m": 60, "min": 60, "minute": 60,
    "h": 3600, "hour": 3600,
    "d": 86400, "day": 86400,
}  # fmt: skip
_RATE = re.compile(r"(\d+)/(\d*)([a-z]+)")


def parse_rate(value: str) -> tuple[int, int] | None:
    """``"600/min"`` -> ``(600, 60)``; ``"5/15min"`` -> ``(5, 900)``; ``"off"`` -> None.

    Raises ValueError for anything else.
    """
    text = value.strip().lower()
    if text in ("off", "none", ""):
        return None
    match = _RATE.fullmatch(text)
    if match is None or match.group(3) not in _RATE_UNITS:
        raise ValueError(f"{value!r} is not a rate such as 600/min, 5/15min or off")
    limit, multiple, unit = int(match.group(1)), int(match.group(2) or 1), match.group(3)
    if limit < 1 or multiple < 1:
        raise ValueError(f"{value!r}: a rate needs at least 1 request per at least 1 unit")
    return limit, multiple * _RATE_UNITS[unit]


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
