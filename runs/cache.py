"""Django's Redis cache with a client kept per connection pool, and a counter in one round trip.

Django's ``RedisCacheClient`` builds a new ``redis.Redis`` for every cache call, and a
``redis.Redis`` builds its table of ~170 response callbacks when it is made: on this
machine that was a third of a millisecond per API request, which counts its principal's
rate in the cache (docs/performance.md). A ``redis.Redis`` is safe to share between
threads (each command takes a connection from the pool), so one per pool is kept.

``incr_window`` counts a hit and sets the counter's expiry in one pipelined round trip,
where ``add`` then ``incr`` took two (``runs.ratelimit.hit``).

The client (and with it the connection pool) is kept per process, not per cache object:
Django keeps cache objects in an ``asgiref`` ``Local``, which under ASGI is one per
request, so every API request built a new pool and opened a new TCP connection to Redis
(a sixth of an ASGI server's CPU per request, by py-spy; docs/performance.md). redis-py's
pool reconnects in a forked child by itself.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class ReusingRedisCacheClient(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        parent: Any = self  # the parent's private helpers have no stubs
        index = parent._get_connection_pool_index(write)
        client = self._clients.get(index)
        if client is None:
            client = self._clients[index] = parent._client(
                connection_pool=parent._get_connection_pool(write)
            )
        return client


_clients: dict[tuple[Any, ...], ReusingRedisCacheClient] = {}
_clients_lock = threading.Lock()


class RedisCache(DjangoRedisCache):
    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = ReusingRedisCacheClient
        parent: Any = self  # the parent's private attributes have no stubs
        self._client_key = (tuple(parent._servers), repr(sorted(parent._options.items())))

    @property
    def _cache(self) -> ReusingRedisCacheClient:
        """The process's client for these servers and options (see the module's doc)."""
        client = _clients.get(self._client_key)
        if client is None:
            with _clients_lock:
                client = _clients.get(self._client_key)
                if client is None:
                    parent: Any = self
                    client = ReusingRedisCacheClient(parent._servers, **parent._options)
                    _clients[self._client_key] = client
        return client

    def incr_window(self, key: str, timeout: int) -> int:
        """Add one to the counter ``key`` (0 when absent) and make it expire in ``timeout``
        seconds; return the new count. One round trip."""
        full = self.make_and_validate_key(key)
        pipe = self._cache.get_client(full, write=True).pipeline(transaction=False)
        pipe.incr(full)
        pipe.expire(full, timeout)
        count, _ = pipe.execute()
        return int(count)
