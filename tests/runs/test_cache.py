"""The Redis cache (runs/cache.py): one client and one connection pool per process.

Django keeps cache objects per thread, and under ASGI per request: a client per cache
object opened a new Redis connection for every API request."""

from __future__ import annotations

import os
import threading

import pytest

from runs.cache import RedisCache

pytestmark = pytest.mark.redis


def cache_object() -> RedisCache:
    # Options of its own: a client no earlier test in this process has used.
    options = {"socket_timeout": 4.25}
    return RedisCache(os.environ["REDIS_URL"], {"KEY_PREFIX": "hp-test-cache", "OPTIONS": options})


def test_cache_objects_of_other_threads_share_one_connection() -> None:
    made: list[RedisCache] = []

    def request() -> None:  # a request in a thread of its own, as under ASGI
        cache = cache_object()
        cache.set("k", "v")
        assert cache.get("k") == "v"
        assert cache.incr_window("n", 10) >= 1
        made.append(cache)

    for _ in range(5):
        thread = threading.Thread(target=request)
        thread.start()
        thread.join()

    assert len({id(cache) for cache in made}) == 5
    assert len({id(cache._cache) for cache in made}) == 1
    pool = made[0]._cache.get_client(write=True).connection_pool
    assert len(pool._available_connections) + len(pool._in_use_connections) == 1


def test_other_servers_or_options_get_their_own_client() -> None:
    url = os.environ["REDIS_URL"]
    base = RedisCache(url, {})
    assert RedisCache(url, {})._cache is base._cache
    assert RedisCache(url, {"OPTIONS": {"socket_timeout": 5}})._cache is not base._cache
