"""A bounded per-process memo: what a web process keeps of a worker's calls between them.

Worker calls repeat themselves: the same token on every call, the same identity headers.
``ProcessMemo`` keeps the answer to the last look-up of each key, under a lock (a process
serves calls on many threads), for at most ``max_entries`` keys (the oldest goes first),
and forgets everything when ``generation()`` moves: the domain counts the changes that
make a kept answer wrong (``runs.tokens.revocations``, ``runs.workers.forgotten``), so a
change made in this process is honoured at once. A change made in another process is the
caller's bound to state (a time to live, a rate of writes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ProcessMemo(Generic[K, V]):
    def __init__(self, max_entries: int, generation: Callable[[], int]) -> None:
        self.max_entries = max_entries
        self._generation = generation
        self._lock = threading.Lock()
        self._entries: dict[K, V] = {}
        self._seen_generation = generation()

    def get(self, key: K) -> V | None:
        with self._lock:
            current = self._generation()
            if current != self._seen_generation:
                self._entries.clear()
                self._seen_generation = current
            return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if key not in self._entries and len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
