"""The demo agents, each a small example of the SDK (also used by the dashboard demo).

- ``auth_token_migration``: observe, ask, approve, a compensable write, an irreversible e-mail.
- ``flaky_deploy``: retries with backoff, a deterministic stop, a repeated-error stop.
- ``webhook_fanout``: several webhooks, one times out: unknown, reconciliation, retry.
- ``nightly_report``: a transient failure with a five-minute backoff.
- ``invoice_chaser``: a typed input, ``ctx.choose``, a webhook and an e-mail, each approved.
"""

from __future__ import annotations

from runtime.demo_agents import (
    auth_token_migration,
    flaky_deploy,
    invoice_chaser,
    nightly_report,
    webhook_fanout,
)

__all__ = [
    "auth_token_migration",
    "flaky_deploy",
    "invoice_chaser",
    "nightly_report",
    "webhook_fanout",
]
