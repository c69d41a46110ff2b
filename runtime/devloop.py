"""The dev loop: ``runagents --reload`` and the one-worker-process rule on SQLite.

``runagents --reload`` is a small supervisor: it runs ``manage.py runagents`` (without
``--reload``) as a child process and watches the Python files the child imported: the
agent modules and what they import (the child lists them, ``ImportsReport``), not an
author's tests and scripts beside them. When one changes it sends the child SIGTERM, which stops it the way a
deployment does: each worker finishes its step (or, after ``--grace-seconds``, is
abandoned at once) and releases its lease, so the new child takes the run over at once
from its checkpoint instead of waiting for a lease to run out. A child that exits by
itself (a syntax error in the agent) is started again at the next change.

On SQLite every process shares one file and no process can wake another (no
``LISTEN/NOTIFY``): one process may run workers (``serve`` with its worker threads, or one
``runagents``), next to any number of others that do not (``serve --workers 0``, the
command-line tools). ``hold_worker_lock`` makes a second worker process fail at start with
a sentence that says what to do.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.management.base import CommandError

from runs.db import sqlite

SKIPPED_DIRS = {".venv", "venv", "var", "node_modules", "__pycache__", ".git", ".mypy_cache"}


# -- SQLite: one process runs workers -----------------------------------------------------------


def hold_worker_lock(what: str) -> IO[str] | None:
    """On SQLite, take the database's worker lock for this process (kept while the returned
    file is open); raise ``CommandError`` when another process holds it. None elsewhere."""
    if not sqlite():
        return None
    import fcntl

    name = str(settings.DATABASES["default"]["NAME"])
    if name == ":memory:" or "mode=memory" in name:
        return None
    path = Path(f"{name}.workers.lock")
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise CommandError(
            f"Another process already runs workers on this SQLite database ({holder}). On "
            "SQLite one process runs the workers: stop it, or run the dashboard without "
            "workers (`python manage.py serve --workers 0`) next to one `runagents`. For "
            "several worker processes, use PostgreSQL (DATABASE_URL)."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{what}, pid {os.getpid()}")
    handle.flush()
    return handle


# -- runagents --reload ---------------------------------------------------------------------------

# The file in which a child ``runagents`` lists the Python files it imported (its path is
# given by the supervisor in this environment variable).
IMPORTS_ENV = "HOLDPOINT_RELOAD_IMPORTS"
_STDLIB = tuple(
    str(Path(p).resolve()) + os.sep
    for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    if p
)


def imported_files() -> dict[Path, float]:
    """The source file of every module this process imported, with its modification time:
    the agent modules and everything they import, ours and the libraries'. The standard
    library is left out (it does not change under a running process)."""
    files: dict[Path, float] = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not isinstance(name, str) or not name.endswith(".py"):
            continue  # built in, compiled, or a namespace package
        path = Path(name).resolve()
        if str(path).startswith(_STDLIB):
            continue
        with contextlib.suppress(OSError):
            files[path] = path.stat().st_mtime
    return files


class ImportsReport:
    """In a child of ``runagents --reload``: tell the supervisor which files to watch, at
    start and again whenever a step imported more (an ``import`` inside a function)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.modules = -1

    @classmethod
    def from_env(cls) -> ImportsReport:
        return cls(os.environ.get(IMPORTS_ENV))

    def refresh(self) -> None:
        if self.path is None or len(sys.modules) == self.modules:
            return
        self.modules = len(sys.modules)
        files = {str(p): mtime for p, mtime in imported_files().items()}
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(files), encoding="utf-8")
        partial.replace(self.path)  # the supervisor never reads half a list


def agent_folders() -> list[Path]:
    """The folders of the agent modules: watched whole only while the child is down."""
    folders: list[Path] = []
    for module in settings.HOLDPOINT_AGENT_MODULES:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin:
                folder = Path(spec.origin).resolve().parent
                if folder not in folders:
                    folders.append(folder)
    return folders


def folder_files(folders: Iterable[Path]) -> set[Path]:
    """Every Python file under ``folders``."""
    files: set[Path] = set()
    for root in folders:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
            files.update(Path(folder) / name for name in names if name.endswith(".py"))
    return files


def snapshot(paths: Iterable[Path]) -> dict[Path, float | None]:
    """The modification time of each file (None: gone)."""
    files: dict[Path, float | None] = {}
    for path in paths:
        try:
            files[path] = path.stat().st_mtime
        except OSError:
            files[path] = None
    return files


def changed_files(before: dict[Path, float | None], after: dict[Path, float | None]) -> list[Path]:
    """Files watched both times whose modification time moved (or that appeared or went)."""
    return sorted(p for p in set(before) & set(after) if before[p] != after[p])


class Reloader:
    """Run ``command`` as a child process; restart it when a file it imported changes.

    What is watched is what the child reports it imported (``ImportsReport``): the agent
    modules and what they import, never an author's tests or scripts beside them. Until the
    first report, what this process imported (it loaded the same agents to check them).
    While the child is down by itself (a syntax error), every Python file in the agent
    modules' folders too: the fix may be in a module it never got to import.
    """

    def __init__(
        self,
        command: list[str],
        *,
        interval: float,
        out: Any,
        stop_wait: float,
        folders: list[Path] | None = None,
    ) -> None:
        self.command = command
        self.interval = interval
        self.out = out
        self.stop_wait = stop_wait
        self.folders = folders or []
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.report: Path | None = None
        self.imported: dict[Path, float] = {}
        self.report_seen: int | None = None

    def say(self, text: str) -> None:
        self.out.write(f"runagents --reload: {text}")
        self.out.flush()

    def start_child(self) -> None:
        env = dict(os.environ)
        if self.report is not None:
            env[IMPORTS_ENV] = str(self.report)
        # Its own session: Ctrl-C reaches the supervisor only, which stops the child once.
        self.child = subprocess.Popen(self.command, start_new_session=True, env=env)  # noqa: S603

    def stop_child(self) -> None:
        """SIGTERM: finish the step and release the leases; after ``stop_wait`` a second
        SIGTERM releases them at once (the step is abandoned, another worker repeats it)."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(self.stop_wait)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(self.stop_wait)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def read_report(self) -> bool:
        """Take the child's latest list of imported files; True when it is a new one."""
        if self.report is None:
            return False
        try:
            seen = self.report.stat().st_mtime_ns
            if seen == self.report_seen:
                return False
            listed = json.loads(self.report.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        self.report_seen = seen
        self.imported = {Path(p): float(mtime) for p, mtime in listed.items()}
        return True

    def watched(self, child_down: bool) -> set[Path]:
        paths = set(self.imported)
        if child_down:
            paths |= folder_files(self.folders)
        return paths

    def run(self) -> None:
        with tempfile.TemporaryDirectory(prefix="holdpoint-reload-") as folder:
            self.report = Path(folder) / "imports.json"
            self._run()

    def _run(self) -> None:
        self.imported = imported_files()
        files = snapshot(self.watched(child_down=False))
        self.say(
            f"watching the {len(files)} Python files the agent modules load "
            f"(from {', '.join(map(str, self.folders)) or 'the project'})"
        )
        self.start_child()
        reported_exit = False
        while not self.stopping.wait(self.interval):
            child_down = self.child is not None and self.child.poll() is not None
            if self.read_report():
                # A file the child imported counts from the time it read it, so a change
                # made between its import and this look restarts it too.
                files = {**files, **{p: m for p, m in self.imported.items() if p not in files}}
            now = snapshot(self.watched(child_down))
            changed = changed_files(files, now)
            files = now
            if changed:
                shown = ", ".join(str(p) for p in changed[:3]) + (" …" if len(changed) > 3 else "")
                self.say(
                    f"{shown} changed; restarting (the workers finish their steps and "
                    "release their leases)"
                )
                self.stop_child()
                self.start_child()
                self.restarts += 1
                reported_exit = False
            elif child_down and not reported_exit:
                assert self.child is not None
                self.say(
                    f"runagents exited with code {self.child.returncode}; it starts again "
                    "when a file changes"
                )
                reported_exit = True
        self.stop_child()


def child_command(options: dict[str, Any]) -> list[str]:
    """``manage.py runagents`` with the same options, without ``--reload``."""
    command = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runagents"]
    flags = {
        "concurrency": "--concurrency",
        "agents": "--agents",
        "lease_seconds": "--lease-seconds",
        "poll_interval": "--poll-interval",
        "sweep_interval": "--sweep-interval",
        "grace_seconds": "--grace-seconds",
        "name": "--name",
    }
    for key, flag in flags.items():
        value = options.get(key)
        if value not in (None, ""):
            command += [flag, str(value)]
    if options.get("no_sweep"):
        command.append("--no-sweep")
    return command


def reload_forever(options: dict[str, Any], out: Any) -> None:
    """``runagents --reload``: until SIGINT / SIGTERM."""
    if options.get("grace_seconds") is None:
        # Developing: do not wait a whole lease for a step; it is repeated from its checkpoint.
        options = {**options, "grace_seconds": 5.0}
    reloader = Reloader(
        child_command(options),
        interval=options.get("reload_interval") or 1.0,
        out=out,
        stop_wait=float(options["grace_seconds"]) + 5.0,
        folders=agent_folders(),
    )

    def on_signal(signum: int, frame: Any) -> None:
        reloader.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    reloader.run()
    reloader.say(f"stopped after {time.monotonic() - started:.0f}s, {reloader.restarts} restarts")
