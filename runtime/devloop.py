"""The dev loop: ``runagents --reload`` and the one-worker-process rule on SQLite.

``runagents --reload`` is a small supervisor: it runs ``manage.py runagents`` (without
``--reload``) as a child process and watches the Python files of the project and of the
agent modules. When one changes it sends the child SIGTERM, which stops it the way a
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
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection

SKIPPED_DIRS = {".venv", "venv", "var", "node_modules", "__pycache__", ".git", ".mypy_cache"}


# -- SQLite: one process runs workers -----------------------------------------------------------


def hold_worker_lock(what: str) -> IO[str] | None:
    """On SQLite, take the database's worker lock for this process (kept while the returned
    file is open); raise ``CommandError`` when another process holds it. None elsewhere."""
    if connection.vendor != "sqlite":
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


def watched_roots() -> list[Path]:
    """The project and the folders of the agent modules (which may live elsewhere)."""
    roots = [Path(settings.BASE_DIR)]
    for module in settings.HOLDPOINT_AGENT_MODULES:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin:
                origin = Path(spec.origin).resolve()
                folder = origin.parent
                if not any(folder.is_relative_to(root) for root in roots):
                    roots.append(folder)
    return roots


def snapshot(roots: Iterable[Path]) -> dict[Path, float]:
    """The modification time of every Python file under ``roots``."""
    files: dict[Path, float] = {}
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
            for name in names:
                if name.endswith(".py"):
                    path = Path(folder) / name
                    with contextlib.suppress(OSError):
                        files[path] = path.stat().st_mtime
    return files


def changed_files(before: dict[Path, float], after: dict[Path, float]) -> list[Path]:
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


class Reloader:
    """Run ``command`` as a child process; restart it when a watched file changes."""

    def __init__(self, command: list[str], *, interval: float, out: Any, stop_wait: float) -> None:
        self.command = command
        self.interval = interval
        self.out = out
        self.stop_wait = stop_wait
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def say(self, text: str) -> None:
        self.out.write(f"runagents --reload: {text}")
        self.out.flush()

    def start_child(self) -> None:
        # Its own session: Ctrl-C reaches the supervisor only, which stops the child once.
        self.child = subprocess.Popen(self.command, start_new_session=True)  # noqa: S603

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

    def run(self) -> None:
        roots = watched_roots()
        files = snapshot(roots)
        self.say(f"watching {len(files)} Python files under {', '.join(map(str, roots))}")
        self.start_child()
        reported_exit = False
        while not self.stopping.wait(self.interval):
            now = snapshot(roots)
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
            elif self.child is not None and self.child.poll() is not None and not reported_exit:
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
    )

    def on_signal(signum: int, frame: Any) -> None:
        reloader.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    reloader.run()
    reloader.say(f"stopped after {time.monotonic() - started:.0f}s, {reloader.restarts} restarts")
