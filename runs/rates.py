"""Rates such as ``600/min``: one parser for the settings (``config/env.py``) and the
counters (``runs/ratelimit.py``). Nothing here imports Django."""

from __future__ import annotations

import re

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
