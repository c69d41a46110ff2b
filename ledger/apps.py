from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Side-effect ledger"

    def ready(self) -> None:
        # runs knows nothing of the ledger (dependencies point runtime -> ledger -> runs);
        # the ledger plugs its retry guard and its reconciler sweep into the run services.
        from ledger.notifications import notifications_send
        from ledger.selectors import retry_guard
        from ledger.services import side_effects_look_up_stale
        from ledger.slack import slack_sync
        from ledger.tools import register_default_tools, tool_facts
        from runs.services import register_retry_guard, register_sweep, register_tool_facts

        register_default_tools()
        register_retry_guard(retry_guard)
        # Who decides an approval depends on the tool's reversibility, which the server
        # knows from the tool (the agent's own declaration or a tool of the server).
        register_tool_facts(tool_facts)
        register_sweep("side_effects", side_effects_look_up_stale)
        # The notification outbox the run store writes is sent here: outbound calls go
        # only through ledger/outbound.py, which the run store may not import.
        register_sweep("notifications", notifications_send)
        # Slack messages are rewritten when their request changes, wherever it was decided.
        register_sweep("slack", slack_sync)
