"""tests/security is the attack list of issue 13, one module per kind of attack: each test is
an attempt that once worked against a production-like deployment and must keep failing.

It is part of the ordinary suite, so `.ci/run` (which runs all of pytest against PostgreSQL
and Redis) runs it. Tests set low rates and lockout limits explicitly with ``settings``; the
defaults are high enough that nothing else in the suite is ever throttled, and the shared
``_fresh_rate_limits`` fixture (tests/conftest.py) starts each test with no counts.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # The personas are created with passwords; the real hasher costs ~0.2 s per check.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
