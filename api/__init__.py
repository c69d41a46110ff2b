"""The HTTP API (docs/api.md), split by concept.

- ``reads``: runs, attempts, events, checkpoints, the inbox, the agents.
- ``control``: start, resume, cancel, retry (people and automation).
- ``worker``: claim and the fenced writes of workers in any language.
- ``idempotency``: ``IdempotentMixin`` for POST endpoints that take an Idempotency-Key.
- ``base``: permission checks and the schema's error documentation.

Every write calls the same ``runs.services`` function as the in-process worker.
"""
