"""Public ids: a type prefix and a ULID, so ids sort by creation time and say what they name."""

from __future__ import annotations

import os
import time

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid() -> str:
    """Return a 26-character ULID: 48 bits of milliseconds, then 80 random bits."""
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str) -> str:
    return f"{prefix}_{ulid()}"


def new_run_id() -> str:
    return new_id("run")


def new_attempt_id() -> str:
    return new_id("att")


def new_checkpoint_id() -> str:
    return new_id("cp")


def new_request_id() -> str:
    return new_id("req")
