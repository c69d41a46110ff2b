"""The dashboard: server-rendered pages with htmx over the run store and the ledger."""
