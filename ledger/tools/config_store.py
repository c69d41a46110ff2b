"""The config store: versioned JSON documents on disk, every version kept.

Layout under the root (``HOLDPOINT_CONFIG_STORE_DIR``)::

    docs/staging/auth/config/@v/000001.json   one file per version, never rewritten
    keys/<sha256 of the idempotency key>.json  which document a key wrote

A version file is written to a temporary file, fsynced, then *linked* to its final
name (``os.link`` fails if the name exists, so two writers can never take the same
version number) and the directory is fsynced: a version is either entirely there
or not there at all. The key file is written first, as the intent; the version file
carries the key too, so ``lookup`` answers from the version files themselves and a
crash between the two writes can never make a key look done when it is not.

Compensation writes a *new* version with the content of the previous one: a
restore undoes the file, not the requests that were served while it was live.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from ledger.tools import ActionFailed, Outcome, ToolResult

# Matched with fullmatch: "$" would let a name end in a newline.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_VERSIONS = "@v"  # "@" cannot start a segment, so no document collides with it.
MAX_SEGMENTS = 8


@dataclass(frozen=True)
class Version:
    document: str
    version: int
    content: Any
    idempotency_key: str
    previous_version: int | None
    restored_from: int | None
    deleted: bool
    written_at: str

    @property
    def reference(self) -> str:
        return f"{self.document}@v{self.version}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "document": self.document,
            "version": self.version,
            "content": self.content,
            "idempotency_key": self.idempotency_key,
            "previous_version": self.previous_version,
            "restored_from": self.restored_from,
            "deleted": self.deleted,
            "written_at": self.written_at,
        }


def check_document_name(document: Any) -> str:
    if not isinstance(document, str) or not document:
        raise ActionFailed("document must be a name like 'staging/auth/config'.")
    segments = document.split("/")
    if len(segments) > MAX_SEGMENTS or not all(_SEGMENT.fullmatch(s) for s in segments):
        raise ActionFailed(
            f"{document!r} is not a document name: up to {MAX_SEGMENTS} segments of letters, "
            "digits, '.', '_' and '-', separated by '/', each starting with a letter or digit."
        )
    return document


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(directory: Path, data: bytes) -> str:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


class ConfigStore:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _versions_dir(self, document: str) -> Path:
        return self.root / "docs" / Path(*check_document_name(document).split("/")) / _VERSIONS

    def _key_path(self, idempotency_key: str) -> Path:
        digest = hashlib.sha256(idempotency_key.encode()).hexdigest()
        return self.root / "keys" / f"{digest}.json"

    def versions(self, document: str) -> list[int]:
        directory = self._versions_dir(document)
        if not directory.is_dir():
            return []
        numbers = []
        for entry in directory.iterdir():
            if entry.suffix == ".json" and entry.stem.isdigit():
                numbers.append(int(entry.stem))
        return sorted(numbers)

    def read(self, document: str, version: int | None = None) -> Version | None:
        """Return one version (the newest when ``version`` is None), or None."""
        if version is None:
            numbers = self.versions(document)
            if not numbers:
                return None
            version = numbers[-1]
        path = self._versions_dir(document) / f"{version:06d}.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return Version(**data)

    def find(self, idempotency_key: str) -> Version | None:
        """The version written with ``idempotency_key``, or None when it was never written."""
        key_path = self._key_path(idempotency_key)
        if not key_path.exists():
            return None
        document = json.loads(key_path.read_text(encoding="utf-8"))["document"]
        for number in reversed(self.versions(document)):
            version = self.read(document, number)
            if version is not None and version.idempotency_key == idempotency_key:
                return version
        return None

    def write(
        self,
        document: str,
        content: Any,
        *,
        idempotency_key: str,
        restored_from: int | None = None,
        deleted: bool = False,
    ) -> Version:
        """Write a new version, or return the one this key already wrote."""
        existing = self.find(idempotency_key)
        if existing is not None:
            return existing
        directory = self._versions_dir(document)
        directory.mkdir(parents=True, exist_ok=True)
        self._write_key(idempotency_key, document)
        while True:
            numbers = self.versions(document)
            previous = numbers[-1] if numbers else None
            version = Version(
                document=document,
                version=(previous or 0) + 1,
                content=content,
                idempotency_key=idempotency_key,
                previous_version=previous,
                restored_from=restored_from,
                deleted=deleted,
                written_at=timezone.now().isoformat(),
            )
            data = json.dumps(version.as_dict(), ensure_ascii=False, indent=2).encode()
            tmp = _write_temp(directory, data)
            try:
                # link() refuses an existing name: a concurrent writer that took this
                # number first makes us go round again with the next one.
                os.link(tmp, directory / f"{version.version:06d}.json")
            except FileExistsError:
                continue
            finally:
                os.unlink(tmp)
            _fsync_dir(directory)
            return version

    def _write_key(self, idempotency_key: str, document: str) -> None:
        key_path = self._key_path(idempotency_key)
        key_path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"idempotency_key": idempotency_key, "document": document}).encode()
        tmp = _write_temp(key_path.parent, data)
        os.replace(tmp, key_path)
        _fsync_dir(key_path.parent)


# What ``ctx.side_effect("config_store", target, request)`` takes (docs/tools.md).
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "document": {
            "type": "string",
            "minLength": 1,
            "maxLength": 900,
            "description": "A name like staging/auth/config.",
        },
        "content": {"description": "Any JSON value: the document's new content."},
    },
    "required": ["document", "content"],
    "additionalProperties": False,
}


class ConfigStoreTool:
    """Write a document version; compensation restores the version before it."""

    name = "config_store"
    request_schema = REQUEST_SCHEMA
    reversibility = "reversible"

    def __init__(self, *, root: Path | str | None = None, name: str = "config_store") -> None:
        self.name = name
        self._root = root

    def store(self) -> ConfigStore:
        # Read the setting at call time, so a test (or a deployment) can point it elsewhere.
        return ConfigStore(self._root or settings.HOLDPOINT_CONFIG_STORE_DIR)

    def validate(self, request: Any) -> None:
        if not isinstance(request, dict) or "content" not in request:
            raise ActionFailed("A config_store request is {document, content}.")
        check_document_name(request.get("document"))
        try:
            json.dumps(request["content"])
        except (TypeError, ValueError):
            raise ActionFailed("content must be JSON.") from None

    def plan_compensation(self, request: Any) -> dict[str, Any] | None:
        document = request.get("document") if isinstance(request, dict) else None
        if not isinstance(document, str):
            return None
        current = self.store().read(document) if _is_valid(document) else None
        return {
            "action": "restore_previous_version",
            "document": document,
            # What the version before this write is now; the exact one is recorded at execute.
            "restore_version": current.version if current is not None else None,
        }

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        self.validate(request)
        version = self.store().write(
            request["document"], request["content"], idempotency_key=idempotency_key
        )
        return _version_result(version)

    def lookup(self, idempotency_key: str) -> Outcome | None:
        version = self.store().find(idempotency_key)
        if version is None:
            return None
        result = _version_result(version)
        return Outcome(
            status="confirmed", external_reference=result.external_reference, result=result.result
        )

    def compensation_preview(self, side_effect: Any) -> dict[str, Any] | None:
        """What compensating ``side_effect`` would do, read now: the document as it is, as it
        will be after the restore, and the versions written on top of this effect since
        (``changed_after``: restoring would throw those away too)."""
        result = side_effect.result or {}
        document = result.get("document") or (side_effect.request or {}).get("document")
        written = result.get("version")
        if not isinstance(document, str) or not _is_valid(document) or not written:
            return None
        store = self.store()
        previous = result.get("previous_version")
        now = store.read(document)
        restore = store.read(document, previous) if previous else None
        own_key = getattr(side_effect, "compensation_idempotency_key", "") or ""
        on_top = []
        for number in store.versions(document):
            if number <= written:
                continue
            version = store.read(document, number)
            # A compensation tried before (same key) is not "another version on top".
            if version is not None and not (own_key and version.idempotency_key == own_key):
                on_top.append(number)
        return {
            "document": document,
            "written_version": written,
            "current_version": now.version if now is not None else None,
            "restore_version": previous,
            "versions_after": on_top,
            "changed_after": bool(on_top),
            "now": None if now is None or now.deleted else now.content,
            "after": None if restore is None or restore.deleted else restore.content,
            "deletes": previous is None,
        }

    def compensate(self, side_effect: Any) -> ToolResult:
        result = side_effect.result or {}
        document = result.get("document") or (side_effect.request or {}).get("document")
        written = result.get("version")
        if not document or not written:
            raise ActionFailed("The side effect does not say which version it wrote.")
        store = self.store()
        previous = result.get("previous_version")
        if previous is None:
            # The write created the document: undoing it is a deletion marker, not an erase.
            version = store.write(
                document,
                None,
                idempotency_key=side_effect.compensation_idempotency_key,
                restored_from=None,
                deleted=True,
            )
        else:
            before = store.read(document, previous)
            if before is None:
                raise ActionFailed(f"Version {previous} of {document!r} is missing.")
            version = store.write(
                document,
                before.content,
                idempotency_key=side_effect.compensation_idempotency_key,
                restored_from=previous,
                deleted=before.deleted,
            )
        return _version_result(version)


def _is_valid(document: str) -> bool:
    try:
        check_document_name(document)
    except ActionFailed:
        return False
    return True


def _version_result(version: Version) -> ToolResult:
    return ToolResult(
        external_reference=version.reference,
        result={
            "document": version.document,
            "version": version.version,
            "previous_version": version.previous_version,
            "restored_from": version.restored_from,
            "deleted": version.deleted,
        },
    )
