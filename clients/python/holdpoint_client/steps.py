"""Running one step function: a plain ``def`` in the worker thread, an ``async def`` on the
worker's event loop, under the same rules.

An async step's coroutine runs on the worker's event loop (one per worker thread, reused
from step to step) in a helper thread, while the worker thread serves the step's ``ctx``
calls: each ``ctx`` call the coroutine makes is carried out on the worker thread, so the
database connection, the fence, the checkpoint, the hold points and the safe points are
exactly those of a plain step (Django refuses database calls from a thread that runs an
event loop). While a ``ctx`` call runs, the coroutine waits for it, as a plain step would.
What the coroutine awaits between ``ctx`` calls (HTTP clients, ``asyncio.gather``) runs on
the loop. Cancel is cooperative, as for a plain step: the next ``ctx`` call stops it.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["run_step"]

_local = threading.local()


def run_step(func: Callable[..., Any], ctx: Any, state: Any) -> Any:
    """Call the step ``func(ctx, state)`` and return what it returned."""
    if not inspect.iscoroutinefunction(func):
        return func(ctx, state)
    return _run_async(func, ctx, state)


def _worker_loop() -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop | None = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop


class _Call:
    def __init__(self, func: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


_FINISHED = object()


class AsyncContext:
    """The ``ctx`` an async step gets: attributes are read as they are; every call is
    carried out on the worker thread (``ctx.ask``, ``ctx.side_effect``…, unchanged)."""

    def __init__(self, ctx: Any, calls: queue.Queue[Any]) -> None:
        self._ctx = ctx
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._ctx, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            request = _Call(value, args, kwargs)
            self._calls.put(request)
            request.done.wait()
            if request.error is not None:
                raise request.error
            return request.result

        return call


def _run_async(func: Callable[..., Any], ctx: Any, state: Any) -> Any:
    calls: queue.Queue[Any] = queue.Queue()
    loop = _worker_loop()
    outcome: dict[str, Any] = {}

    def on_the_loop() -> None:
        try:
            outcome["result"] = loop.run_until_complete(func(AsyncContext(ctx, calls), state))
        except BaseException as exc:  # noqa: BLE001 - handed back to the worker thread
            outcome["error"] = exc
        finally:
            calls.put(_FINISHED)

    helper = threading.Thread(target=on_the_loop, name=f"{threading.current_thread().name}/loop")
    helper.start()
    while True:
        item = calls.get()
        if item is _FINISHED:
            break
        try:
            item.result = item.func(*item.args, **item.kwargs)
        except BaseException as exc:  # noqa: BLE001 - raised again in the coroutine
            item.error = exc
        finally:
            item.done.set()
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")
