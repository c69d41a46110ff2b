"""Rows of the hottest reads as model instances, without building an ORM query each time.

Building a queryset's SQL costs more CPU than PostgreSQL spends answering it: on this
machine ``Run.objects.filter(pk=…).first()`` is ~0.6 ms of CPU against ~0.1 ms for the
same statement through a cursor (docs/performance.md). The few reads every control
operation and worker call makes (the run, its lock, the attempt, the worker token) use
this instead: the columns are listed once per model, values go through each field's
``from_db_value`` (JSON) and the instance is made with ``Model.from_db``, as the ORM
makes it. PostgreSQL only; callers keep the ORM path for SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


@cache
def _shape(model: type[Model]) -> tuple[list[str], list[str], list[tuple[int, Any]]]:
    fields = model._meta.concrete_fields
    converters = [
        (index, field) for index, field in enumerate(fields) if hasattr(field, "from_db_value")
    ]
    return [str(f.column) for f in fields], [f.attname for f in fields], converters


def columns(model: type[Model], alias: str) -> str:
    """``alias."col", …`` for every concrete field of ``model``, in ``build``'s order."""
    return ", ".join(f'{alias}."{column}"' for column in _shape(model)[0])


def width(model: type[Model]) -> int:
    return len(_shape(model)[0])


def build(model: type[M], values: Sequence[Any]) -> M:
    """An instance of ``model`` from the values of ``columns(model, …)``, as the ORM makes it."""
    _columns, attnames, converters = _shape(model)
    row = list(values[: len(attnames)])
    for index, field in converters:
        if row[index] is not None:
            row[index] = field.from_db_value(row[index], None, connection)
    return model.from_db(connection.alias, attnames, row)


def fetch(model: type[M], sql: str, params: Sequence[Any]) -> tuple[M, tuple[Any, ...]] | None:
    """Run ``sql`` (its first columns ``columns(model, …)``); the instance and the row's
    remaining values, or None without a row."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    return build(model, row), tuple(row[width(model) :])


def by_pk(model: type[M], pk: Any) -> M | None:
    """``model.objects.filter(pk=pk).first()`` in one cheap statement."""
    meta = model._meta
    sql = (
        f'SELECT {columns(model, "t")} FROM "{meta.db_table}" t '  # noqa: S608 - names from the models
        f'WHERE t."{meta.pk.column}" = %s'
    )
    found = fetch(model, sql, [pk])
    return None if found is None else found[0]


def get(model: type[M], pk: Any) -> M | None:
    """The row ``pk`` of ``model`` or None: ``by_pk`` on PostgreSQL, the ORM elsewhere."""
    if connection.vendor == "postgresql":
        return by_pk(model, pk)
    found: M | None = model._default_manager.filter(pk=pk).first()
    return found
