"""The TypeScript client (clients/typescript) for tests: built once per session from the
committed lockfile (``npm ci``, then ``tsc``). Without npm a test is skipped, with its
reason; in CI (``CI=true``) it fails instead."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

CLIENT = Path(settings.BASE_DIR) / "clients" / "typescript"
_built: list[bool] = []


def npm() -> str:
    found = shutil.which("npm")
    if found is None or shutil.which("node") is None:
        if os.environ.get("CI"):
            pytest.fail("Node and npm are needed for the TypeScript client's tests")
        pytest.skip("Node and npm are not installed")
    return found


def build() -> None:
    """Build the client (once per test session): ``dist/`` then holds what the tests run."""
    command = npm()
    if _built:
        return
    if not (CLIENT / "node_modules" / "typescript").exists():
        subprocess.run([command, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True)
    subprocess.run([command, "run", "build"], cwd=CLIENT, check=True)
    _built.append(True)
