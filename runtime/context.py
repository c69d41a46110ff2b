"""The ``ctx`` a step receives is the agent SDK's one ``Context``
(``holdpoint_client/context.py``), on whichever backend runs it; named here for the
server's modules."""

from __future__ import annotations

from holdpoint_client.backend import hold_point_key, to_json
from holdpoint_client.context import Context, change_is_empty, fingerprint

__all__ = ["Context", "change_is_empty", "fingerprint", "hold_point_key", "to_json"]
