"""What every benchmark shares: its own scratch database, Django set-up, statistics, output.

Every script measures its peer or baseline in the same run and prints them side by
side: absolute times on a shared 2-core machine are noise, ratios much less so.

Databases. A script never touches the database named in ``DATABASE_URL``: it works
in ``<name>_<suffix>`` (``holdpoint_control`` for ``…/holdpoint``), created from a
migrated template ``<name>_benchtmpl`` (migrated once per set of migration files)
and dropped at the end unless ``--keep``. So the benchmarks never disturb a test
run on the same server, and a benchmark always starts on empty tables.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
PYTHON = sys.executable


# --- Databases ---------------------------------------------------------------------------------


def base_database_url() -> str:
    url = os.environ.get("BENCH_BASE_DATABASE_URL") or os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit(
            "The benchmarks need PostgreSQL: set DATABASE_URL=postgres://USER@HOST:PORT/NAME "
            "(each script works in its own database NAME_<script> next to it)."
        )
    return url


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def libpq_url(url: str) -> str:
    """psycopg accepts postgres:// URLs as they are; keep one place to adapt them."""
    return url


def _admin_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(libpq_url(with_database(url, "postgres")), autocommit=True)


def _migrations_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("*/migrations/0*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _template(url: str) -> str:
    """A migrated template database, rebuilt when the migrations change."""
    name = f"{database_name(url)}_benchtmpl"
    wanted = _migrations_hash()
    with _admin_connect(url) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            [name],
        ).fetchone()
        if row is not None and row[0] == wanted:
            return name
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": with_database(url, name), "LOG_LEVEL": "WARNING"}
    subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    with _admin_connect(url) as conn:
        conn.execute(f"COMMENT ON DATABASE \"{name}\" IS '{wanted}'")
    return name


def create_scratch_database(suffix: str) -> str:
    """Create ``<name>_<suffix>`` afresh from the migrated template; return its URL."""
    base = base_database_url()
    template = _template(base)
    name = f"{database_name(base)}_{suffix}"
    with _admin_connect(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return with_database(base, name)


def drop_database(url: str) -> None:
    with _admin_connect(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database_name(url)}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_database(suffix: str, *, keep: bool = False) -> Iterator[str]:
    """Point this process (and the processes it starts) at a fresh scratch database."""
    url = create_scratch_database(suffix)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    try:
        yield url
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if keep:
            print(f"(kept database {database_name(url)})")
        else:
            drop_database(url)


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def declare_bench_agent(name: str = "bench-agent") -> str:
    """An HTTP-worker agent row: ``run_start`` accepts it without any agent code loaded."""
    from runs.models import DeclaredAgent

    DeclaredAgent.objects.update_or_create(
        name=name,
        defaults={
            "description": "benchmark agent",
            "retry_policy": {"max_attempts": 3, "backoff_initial": 0.0, "jitter": 0.0},
        },
    )
    return name


def person(username: str, group: str) -> tuple[Any, str]:
    """A user in one of the default groups, and its API token: (user, token key)."""
    import uuid

    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from runs.groups import ensure_default_groups

    ensure_default_groups()
    user = User.objects.create_user(username=username, password=uuid.uuid4().hex)
    user.groups.add(Group.objects.get(name=group))
    return user, Token.objects.create(user=user).key


# --- Processes ---------------------------------------------------------------------------------


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` different free ports, chosen while all are held: ports taken one at a time
    may repeat when the first one's server has not bound it yet."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def wait_for_http(
    url: str, *, timeout: float = 30.0, proc: subprocess.Popen[Any] | None = None
) -> None:
    """Until ``url`` answers (any status); fail at ``timeout`` or as soon as ``proc``, the
    process that should answer, has exited."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{url}: the process exited ({proc.returncode})") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {timeout:.0f} s") from None
            time.sleep(0.1)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far: less noisy than wall time on a busy machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a multi-process server's workers)."""
    found = [pid]
    for child in found:
        for task in Path(f"/proc/{child}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                found += [int(p) for p in task.read_text().split()]
    return found


@dataclass
class Server:
    base: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU of the server's process and its workers (those alive when asked)."""
        total = 0.0
        for pid in process_tree(self.pid):
            with contextlib.suppress(OSError):
                total += process_cpu_seconds(pid)
        return total


# The web servers bench.servers compares. Each command serves config.asgi (or config.wsgi)
# on PORT with WORKERS processes; ``daphne`` has one process (its Procfile line).
SERVERS: dict[str, list[str]] = {
    "daphne": [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "config.asgi:application"],
    "uvicorn": [
        PYTHON, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
        "--port", "{port}", "--workers", "{workers}", "--loop", "uvloop", "--http",
        "httptools", "--lifespan", "off", "--no-access-log", "--log-level", "warning",
        "--timeout-keep-alive", "{keep_alive}",
    ],
    "granian": [
        PYTHON, "-m", "granian", "--interface", "asginl", "--host", "127.0.0.1",
        "--port", "{port}", "--workers", "{workers}", "--loop", "uvloop",
        "--log-level", "warning", "config.asgi:application",
    ],
    "granian-wsgi": [
        PYTHON, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1",
        "--port", "{port}", "--workers", "{workers}", "--blocking-threads", "8",
        "--log-level", "warning", "config.wsgi:application",
    ],
    "gunicorn": [
        PYTHON, "-m", "gunicorn", "--bind", "127.0.0.1:{port}", "--workers", "{workers}",
        "--worker-class", "gthread", "--threads", "8", "--log-level", "warning",
        "config.wsgi:application",
    ],
}  # fmt: skip


# The Procfile's web line: uvicorn, one worker process per core, keeping an idle connection
# open 75 s (WEB_KEEP_ALIVE): longer than any client keeps one to reuse it (httpx 5 s, Node's
# fetch 4 s, nginx's upstream keepalive_timeout 60 s), so the server never closes a
# connection under a request a client has just sent on it (docs/operations.md, Overload).
PRODUCTION_SERVER = "uvicorn"
KEEP_ALIVE_SECONDS = 75
PRODUCTION_WORKERS = os.cpu_count() or 1


def add_server_arguments(parser: Any, *, workers_help: str = "server processes") -> None:
    """``--server`` and ``--workers``, defaulting to the Procfile's web line."""
    parser.add_argument(
        "--server", default=PRODUCTION_SERVER, choices=list(SERVERS), help="as the Procfile"
    )
    parser.add_argument(
        "--workers", type=int, default=PRODUCTION_WORKERS, help=f"{workers_help} (one per core)"
    )


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def web_server(
    kind: str = "daphne",
    *,
    workers: int = 1,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> Iterator[Server]:
    """Run a web server on a free port against this process's DATABASE_URL (a pool of 8
    database connections per process unless ``env`` says otherwise), with the Procfile's
    keep-alive (``KEEP_ALIVE_SECONDS``, or ``WEB_KEEP_ALIVE`` in ``env``) for uvicorn."""
    port = free_port()
    keep_alive = (env or {}).get("WEB_KEEP_ALIVE") or str(KEEP_ALIVE_SECONDS)
    command = [
        part.format(port=port, workers=workers, keep_alive=keep_alive) for part in SERVERS[kind]
    ]
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "DATABASE_POOL_SIZE": "8", **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + "/healthz")
        if workers > 1:
            # Every worker answers before the clock starts (they boot one by one).
            deadline = time.monotonic() + 30
            while len(process_tree(proc.pid)) <= workers and time.monotonic() < deadline:
                time.sleep(0.1)
        yield Server(base=base, pid=proc.pid)
    finally:
        stop_process(proc)
        if log:
            out.close()  # type: ignore[union-attr]


@contextlib.contextmanager
def daphne(*, env: dict[str, str] | None = None, log: Path | None = None) -> Iterator[Server]:
    """One daphne process, the way the Procfile's ``web`` line runs it."""
    with web_server("daphne", env=env, log=log) as server:
        yield server


# --- Statistics --------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass(frozen=True)
class Summary:
    n: int
    p50: float
    p95: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Summary:
        ordered = sorted(values)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            n=len(ordered),
            p50=percentile(ordered, 50),
            p95=percentile(ordered, 95),
            p99=percentile(ordered, 99),
            max=ordered[-1],
            mean=sum(ordered) / len(ordered),
        )

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in self.__dict__.items()}


def ms(seconds: Iterable[float]) -> list[float]:
    return [s * 1000 for s in seconds]


# --- Output ------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (readable in a terminal and pasteable into docs/performance.md)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            if math.isnan(value):
                return "-"
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text_rows)) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |"
        for r in text_rows
    ]
    return "\n".join(lines)


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "MISSED")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory_gib"] = round(int(mem) / 1024 / 1024, 1)
    with contextlib.suppress(OSError):
        info["loadavg_at_start"] = Path("/proc/loadavg").read_text().split()[:3]
    url = os.environ.get("BENCH_BASE_DATABASE_URL") or os.environ.get("DATABASE_URL", "")
    with contextlib.suppress(Exception), _admin_connect(url) as conn:
        info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
        info["synchronous_commit"] = conn.execute("SHOW synchronous_commit").fetchone()[0]
        info["fsync"] = conn.execute("SHOW fsync").fetchone()[0]
    return info


def save_result(name: str, result: dict[str, Any]) -> Path:
    """Keep the figures of one script as JSON (``bench.all`` keeps what each script printed)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {
        "name": name,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", "-m", f"bench.{name}", *sys.argv[1:]]),
        "machine": machine(),
        **result,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def parse_int_list(text: str) -> list[int]:
    values = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        factor = 1
        if part.endswith("k"):
            factor, part = 1000, part[:-1]
        elif part.endswith("m"):
            factor, part = 1_000_000, part[:-1]
        values.append(int(float(part) * factor))
    return values
