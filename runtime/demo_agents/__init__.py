"""The demo agents, each a small example of the SDK (also used by the dashboard demo).

- ``flaky_deploy``: retries with backoff, a deterministic stop, a repeated-error stop.
"""

from __future__ import annotations

from runtime.demo_agents import flaky_deploy

__all__ = ["flaky_deploy"]
