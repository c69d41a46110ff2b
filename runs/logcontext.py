"""Which run and attempt the current code works for, carried into every log line.

The worker binds the ids around each attempt (``with bind(run_id=…, attempt_id=…)``);
``config.logging.JsonFormatter`` and ``ContextFilter`` read them, so with
``LOG_FORMAT=json`` each line carries ``run_id`` and ``attempt_id``.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager

# Never mutated in place: bind() sets a new dict, so the shared empty default is safe.
_EMPTY: dict[str, str] = {}
_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar(
    "holdpoint_log_context", default=_EMPTY
)


@contextmanager
def bind(**ids: str | None) -> Iterator[None]:
    token = _context.set({**_context.get(), **{k: v for k, v in ids.items() if v}})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict[str, str]:
    return dict(_context.get())


class ContextFilter(logging.Filter):
    """Copy the bound ids onto each record (``record.run_id``, ``record.attempt_id``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
