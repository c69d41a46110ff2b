"""A remote agent whose step sleeps (``ctx.sleep``) and then checkpoints, for the tests of
SIGTERM and ``--grace`` (tests/clients/test_sigterm_grace.py). Its TypeScript twin is
``napper`` in clients/typescript/test/agents.mjs.

Each nap writes what it did to ``naps.log`` in ``HOLDPOINT_TEST_TOOL_DIR``: ``start N``
when attempt N began it, ``end N SECONDS TIME`` when its sleep was over (SECONDS measured
on the monotonic clock, TIME the wall clock of this machine, which the test shares), so
that a test sees whether a sleep was cut short, finished, or never ended. The first
attempt sleeps ``seconds``, later ones ``again`` (default: ``seconds``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from holdpoint_client import Agent, Context, Done, Next


def _note(line: str) -> None:
    with (Path(os.environ["HOLDPOINT_TEST_TOOL_DIR"]) / "naps.log").open("a") as log:
        log.write(line + "\n")


napper = Agent(name="remote-nap", description="Sleeps in a step, then checkpoints")


@napper.step(start=True)
def nap(ctx: Context, state: dict[str, Any]) -> Next:
    _note(f"start {ctx.attempt_number}")
    began = time.monotonic()
    seconds = float(ctx.input.get("seconds", 6))
    ctx.sleep(seconds if ctx.attempt_number == 1 else float(ctx.input.get("again", seconds)))
    slept = time.monotonic() - began
    _note(f"end {ctx.attempt_number} {slept:.3f} {time.time():.3f}")
    return ctx.next("wake", {"slept": slept})


@napper.step
def wake(ctx: Context, state: dict[str, Any]) -> Done:
    return ctx.done(state)
