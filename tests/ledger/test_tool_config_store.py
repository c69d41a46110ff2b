"""The config store on a real directory: versions kept, keys recognised, restores."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ledger.tools import ActionFailed, get_tool
from ledger.tools.config_store import ConfigStore, ConfigStoreTool


def test_it_writes_a_new_version_each_time_and_keeps_every_one(config_dir: Path) -> None:
    tool = get_tool("config_store")
    first = tool.execute({"document": "staging/auth/config", "content": {"ttl": 60}}, "k1")
    second = tool.execute({"document": "staging/auth/config", "content": {"ttl": 30}}, "k2")
    assert first.external_reference == "staging/auth/config@v1"
    assert second.external_reference == "staging/auth/config@v2"
    assert second.result["previous_version"] == 1
    store = ConfigStore(config_dir)
    assert store.versions("staging/auth/config") == [1, 2]
    assert store.read("staging/auth/config").content == {"ttl": 30}
    assert store.read("staging/auth/config", 1).content == {"ttl": 60}
    on_disk = config_dir / "docs" / "staging" / "auth" / "config" / "@v" / "000001.json"
    assert json.loads(on_disk.read_text())["idempotency_key"] == "k1"
    # No temporary files are left behind.
    assert not [p for p in on_disk.parent.iterdir() if p.name.startswith(".tmp-")]


def test_the_same_key_writes_once(config_dir: Path) -> None:
    tool = get_tool("config_store")
    a = tool.execute({"document": "app", "content": 1}, "k1")
    b = tool.execute({"document": "app", "content": 1}, "k1")
    assert a == b
    assert ConfigStore(config_dir).versions("app") == [1]


def test_it_looks_keys_up_from_the_versions_themselves(config_dir: Path) -> None:
    tool = get_tool("config_store")
    assert tool.lookup("k1") is None
    tool.execute({"document": "app", "content": {"a": 1}}, "k1")
    outcome = tool.lookup("k1")
    assert outcome is not None
    assert (outcome.status, outcome.external_reference) == ("confirmed", "app@v1")
    # A crash after the key file but before the version: the key is *not* done.
    store = ConfigStore(config_dir)
    store._write_key("k-crashed", "app")
    assert tool.lookup("k-crashed") is None


def test_concurrent_writers_never_share_a_version_number(config_dir: Path) -> None:
    store = ConfigStore(config_dir)
    barrier = threading.Barrier(8)

    def write(i: int) -> None:
        barrier.wait()
        store.write("app", {"i": i}, idempotency_key=f"k{i}")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.versions("app") == list(range(1, 9))
    assert sorted(store.read("app", n).content["i"] for n in range(1, 9)) == list(range(8))


def test_compensation_restores_the_previous_version_as_a_new_one(config_dir: Path) -> None:
    tool = get_tool("config_store")
    tool.execute({"document": "app", "content": {"ttl": 60}}, "k1")
    done = tool.execute({"document": "app", "content": {"ttl": 5}}, "k2")
    effect = SimpleNamespace(
        result=done.result, request={"document": "app"}, compensation_idempotency_key="k2.undo"
    )
    undone = tool.compensate(effect)  # type: ignore[attr-defined]
    again = tool.compensate(effect)  # type: ignore[attr-defined]
    assert undone == again  # the compensation's own key makes a repeat harmless
    store = ConfigStore(config_dir)
    assert store.versions("app") == [1, 2, 3]
    latest = store.read("app")
    assert (latest.content, latest.restored_from) == ({"ttl": 60}, 1)
    assert undone.external_reference == "app@v3"


def test_compensating_a_creation_writes_a_deletion_marker(config_dir: Path) -> None:
    tool = get_tool("config_store")
    done = tool.execute({"document": "new", "content": {"x": 1}}, "k1")
    effect = SimpleNamespace(
        result=done.result, request={"document": "new"}, compensation_idempotency_key="k1.undo"
    )
    tool.compensate(effect)  # type: ignore[attr-defined]
    latest = ConfigStore(config_dir).read("new")
    assert latest.deleted is True and latest.content is None
    assert ConfigStore(config_dir).read("new", 1).content == {"x": 1}


@pytest.mark.parametrize(
    "document", ["", "../etc/passwd", "/abs", "a//b", ".hidden", "a/@v", "x" * 101, 7]
)
def test_it_refuses_document_names_that_could_escape_or_collide(
    config_dir: Path, document: object
) -> None:
    with pytest.raises(ActionFailed):
        ConfigStoreTool().validate({"document": document, "content": {}})


def test_it_fsyncs_every_version(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    ConfigStore(config_dir).write("app", {}, idempotency_key="k1")
    # The key file and its directory, the version file and its directory.
    assert len(synced) == 4
