"""A private PostgreSQL cluster for the chaos run, so that restarting it disturbs nobody.

The harness restarts PostgreSQL once in the middle of the run. The server in
``DATABASE_URL`` is shared (tests of other people may be running on it), so the
harness starts its own cluster with the same binaries (``initdb``/``pg_ctl``), in a
temporary directory, on a free port, with the same durability as a default
installation (``fsync`` and ``synchronous_commit`` on). As root it runs the server
as the ``postgres`` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def find_bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``, or None when PostgreSQL is not installed."""
    explicit = os.environ.get("CHAOS_PG_BINDIR")
    candidates = [explicit] if explicit else []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            candidates.append(subprocess.check_output([pg_config, "--bindir"], text=True).strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


class PrivateCluster:
    def __init__(self, bindir: Path, port: int) -> None:
        self.bindir = bindir
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="holdpoint-chaos-pg-"))
        self.datadir = self.root / "data"
        self.log = self.root / "server.log"
        self.as_postgres = os.geteuid() == 0
        self.restarts = 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, text=True)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/holdpoint_chaos"

    def start(self) -> None:
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._pg_ctl_start()
        self._run(
            "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "holdpoint_chaos"
        )

    def _pg_ctl_start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            f"-c unix_socket_directories={self.root}"
        )
        self._run(
            "pg_ctl", "-D", str(self.datadir), "-l", str(self.log), "-o", options, "-w", "start"
        )

    def restart(self) -> float:
        """Restart in fast mode (active transactions are rolled back); return the seconds."""
        t0 = time.monotonic()
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "fast", "-w", "stop")
        self._pg_ctl_start()
        self.restarts += 1
        return time.monotonic() - t0

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)
