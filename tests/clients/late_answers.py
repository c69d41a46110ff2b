"""A TCP proxy in front of the live server whose answers reach the client ``delay`` seconds
late, as on a loaded machine (or a slow network): what the client sends goes through at
once, every byte the server sends back is held for ``delay`` seconds (in order, as a
network's latency would, not one chunk after another).

The server and the client are the real ones; only the time between them is stretched.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType


class LateAnswers:
    def __init__(self, target_host: str, target_port: int, delay: float) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="late-answers", daemon=True)
        self._stopping: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LateAnswers:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stopping.wait()
            server.close()
            # Close the connections still open, and let their tasks end, before the loop.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

    async def _connect(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        try:
            server_in, server_out = await asyncio.open_connection(*self.target)
        except OSError:
            client_out.close()
            return
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        tasks = [
            asyncio.create_task(self._forward(client_in, server_out)),
            asyncio.create_task(self._hold(server_in, queue)),
            asyncio.create_task(self._release(queue, client_out)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            # One side closed: let what is held reach the client, then close both.
            await asyncio.wait_for(queue.join(), self.delay + 5)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_out, server_out):
                with contextlib.suppress(Exception):
                    writer.close()

    @staticmethod
    async def _forward(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()

    async def _hold(
        self, source: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]]
    ) -> None:
        loop = asyncio.get_running_loop()
        while chunk := await source.read(65536):
            await queue.put((loop.time() + self.delay, chunk))

    @staticmethod
    async def _release(
        queue: asyncio.Queue[tuple[float, bytes]], sink: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, chunk = await queue.get()
            try:
                await asyncio.sleep(max(0.0, due - loop.time()))
                sink.write(chunk)
                await sink.drain()
            finally:
                queue.task_done()
