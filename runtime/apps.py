from __future__ import annotations

from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Worker runtime"

    def ready(self) -> None:
        # Agent modules register their agents with the run store when imported, so that
        # run_start accepts them in every process: web servers as well as workers.
        from runtime.registry import load_agent_modules

        load_agent_modules()
