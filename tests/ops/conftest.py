"""Fixtures of the operations tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def test_database_url(db: None) -> str:
    """The URL of pytest-django's test database (``test_<name>``), for subprocesses. It asks
    for ``db`` (not only ``django_db_setup``): pytest-django creates the test database only
    when a collected test uses one, and a run of this file alone would otherwise point the
    subprocess at the developer's own database."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
