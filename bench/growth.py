"""Growth: inbox and runs-list page time and query count at 10k, 100k and 1M runs.

The runs are bulk-generated (``bench.datagen``): first 10,000 runs waiting at a hold
point with a pending request each (the inbox), then finished history (80 % succeeded,
10 % failed, 7 % cancelled, 3 % queued) up to each size; the tables grow in place
from one size to the next, then ``VACUUM ANALYZE``. At 10k every run is one of the
10k waiting runs.

Pages are requested in-process through Django's full stack (middleware, auth,
serializers, templates; no socket), as an operator: the JSON inbox and runs list of
the API (first page, a status filter, the second page by cursor) and the dashboard's
inbox and runs pages when the dashboard is installed. For each: p50/p95 time,
the number of SQL queries, and ``EXPLAIN ANALYZE`` of every query at the largest size
(all sizes are in the JSON result). Target: p95 < 100 ms and flat with table size; the
operations page and ``GET /api/stats/operations`` (issue 30, both windows) and the run
page with its timeline p95 < 200 ms, after the sweep's rollup of the generated history
(its time is printed and kept).

    python -m bench.growth [--sizes 10k,100k,1M] [--pending 10k] [--requests 30] [--keep]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import datagen
from bench.common import (
    Summary,
    parse_int_list,
    person,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
)

AGENT = "bench-agent"


def _pages(client: Any) -> list[tuple[str, str]]:
    """(label, path) of every page to measure; the second API page comes from a cursor."""
    pages = [
        ("API inbox: /api/input-requests", "/api/input-requests?status=pending"),
        ("API runs: /api/runs", "/api/runs"),
        ("API runs ?status=failed", "/api/runs?status=failed"),
    ]
    first = client.get("/api/runs")
    nxt = first.json().get("next")
    if nxt:
        pages.append(("API runs, page 2 (cursor)", nxt.split("testserver", 1)[-1]))
    from django.urls import Resolver404, resolve

    # The operations page (issue 30) and its JSON (runs/stats.py): both windows.
    pages += [
        ("API stats: /api/stats/operations", "/api/stats/operations"),
        ("API stats ?window=7d", "/api/stats/operations?window=7d"),
    ]
    for label, path in (
        ("dashboard inbox: /", "/"),
        ("dashboard runs: /runs/", "/runs/"),
        ("dashboard operations: /operations/", "/operations/"),
        ("dashboard operations ?window=7d", "/operations/?window=7d"),
    ):
        try:
            match = resolve(path.split("?")[0])
        except Resolver404:
            continue
        if match.url_name in {"inbox", "run-list", "operations"}:
            pages.append((label, path))
    # The run page with its timeline (issue 30, dashboard/timeline.py): the newest run of
    # the generated history, read and drawn among a table of every size.
    from runs.models import Run

    newest = Run.objects.filter(agent=AGENT).order_by("-created_at").values_list("id", flat=True)
    run_id = newest.first()
    if run_id is not None:
        pages.append(("dashboard run page + timeline: /runs/<id>/", f"/runs/{run_id}/"))
    return pages


# Paths served to the signed-in browser client (the others go to the API client).
DASHBOARD_PREFIXES = ("/runs/", "/operations/")
# p95 targets: the inbox and runs lists 100 ms; the operations page, its API and the run
# page with its timeline 200 ms (issue 30).
TARGET_MS = {"stats": 200.0, "operations": 200.0, "run page": 200.0}


def target_ms(label: str) -> float:
    return next((ms for key, ms in TARGET_MS.items() if key in label), 100.0)


def _rollup() -> float:
    """What the sweep keeps for the operations page: its hourly rollup over the generated
    history (the first one reads all of it, the worst case), timed."""
    from runs.stats import stats_rollup

    t = time.monotonic()
    stats_rollup(force=True)
    return time.monotonic() - t


def _capture(client: Any, path: str) -> list[tuple[str, Any]]:
    from django.db import connection

    captured: list[tuple[str, Any]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        captured.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        response = client.get(path)
    if response.status_code != 200:
        raise SystemExit(f"{path} answered {response.status_code}")
    return captured


def _explain(sql: str, params: Any) -> str:
    from django.db import connection

    if not sql.lstrip().upper().startswith("SELECT"):
        return ""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _clients() -> tuple[Any, Any]:
    from django.test import Client

    user, token = person("bench-growth", "admin")
    api = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")
    page = Client(HTTP_HOST="127.0.0.1")
    page.force_login(user)
    return api, page


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10k,100k,1M", help="run counts (default 10k,100k,1M)")
    parser.add_argument("--pending", default="10k", help="pending requests (default 10k)")
    parser.add_argument("--requests", type=int, default=30, help="timed requests per page")
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args(argv)
    sizes = parse_int_list(opts.sizes)
    pending = parse_int_list(opts.pending)[0]
    figures: dict[str, Any] = {"pending": pending, "sizes": {}}

    with scratch_database("growth", keep=opts.keep) as url:
        setup_django()
        import psycopg
        from django.db import connection

        api, page = _clients()
        total = 0
        explains: dict[str, list[str]] = {}
        for size in sizes:
            t0 = time.monotonic()
            with psycopg.connect(url, autocommit=True) as conn:
                if total == 0:
                    datagen.generate(
                        conn,
                        kind="waiting",
                        start=1,
                        count=min(pending, size),
                        agent=AGENT,
                        tag="W",
                    )
                    total = min(pending, size)
                if size > total:
                    # Generate in slices of 100k so one transaction never gets huge.
                    for start in range(total + 1, size + 1, 100_000):
                        count = min(100_000, size + 1 - start)
                        datagen.generate(conn, kind="mixed", start=start, count=count, agent=AGENT)
                    total = size
                conn.execute("VACUUM ANALYZE")
            generated = time.monotonic() - t0
            rolled = _rollup()
            print(
                f"  {size:,} runs ready ({generated:.0f} s to generate, {rolled:.1f} s for the "
                "operations page's rollup)",
                flush=True,
            )
            entry: dict[str, Any] = {
                "generate_seconds": round(generated, 1),
                "rollup_seconds": round(rolled, 2),
                "pages": {},
            }
            for label, path in _pages(api):
                client = page if path == "/" or path.startswith(DASHBOARD_PREFIXES) else api
                for _ in range(3):
                    client.get(path)
                times = []
                for _ in range(opts.requests):
                    t = time.perf_counter()
                    client.get(path)
                    times.append((time.perf_counter() - t) * 1000)
                queries = _capture(client, path)
                plans = [_explain(sql, params) for sql, params in queries]
                summary = Summary.of(times)
                entry["pages"][label] = {
                    "path": path,
                    "ms": summary.as_dict(),
                    "queries": len(queries),
                    "seq_scans": sum(p.count("Seq Scan on runs_") for p in plans),
                    "explain": [
                        {"sql": sql[:2000], "plan": p}
                        for (sql, _), p in zip(queries, plans, strict=True)
                    ],
                }
                explains[label] = [
                    f"-- {sql[:300]}{'…' if len(sql) > 300 else ''}\n{p}"
                    for (sql, _), p in zip(queries, plans, strict=True)
                    if p
                ]
            figures["sizes"][str(size)] = entry
            connection.close()

    labels = list(next(iter(figures["sizes"].values()))["pages"])
    rows = []
    for label in labels:
        row: list[Any] = [label]
        for size in sizes:
            p = figures["sizes"][str(size)]["pages"].get(label)
            row += [p["ms"]["p50"], p["ms"]["p95"], p["queries"]] if p else ["", "", ""]
        rows.append(row)
    headers = ["page"]
    for size in sizes:
        short = f"{size // 1_000_000}M" if size >= 1_000_000 else f"{size // 1000}k"
        headers += [f"{short} p50 ms", f"{short} p95 ms", f"{short} queries"]
    print()
    print(f"Page time by table size ({pending:,} pending requests; in-process, as an admin)")
    print(table(headers, rows))
    largest = str(sizes[-1])
    checks = []
    for label in labels:
        pages = [figures["sizes"][str(s)]["pages"][label] for s in sizes]
        p95 = pages[-1]["ms"]["p95"]
        growth = p95 / pages[0]["ms"]["p95"] if pages[0]["ms"]["p95"] else float("nan")
        seq = figures["sizes"][largest]["pages"][label]["seq_scans"]
        goal = target_ms(label)
        checks.append(
            f"{label}: p95 {p95:.1f} ms at {sizes[-1]:,} ({verdict(p95 < goal)} < {goal:.0f} ms), "
            f"{growth:.2f}x the p95 at {sizes[0]:,}; queries "
            f"{'/'.join(str(p['queries']) for p in pages)}; seq scans on runs_* tables at {sizes[-1]:,}: {seq}"
        )
    figures["targets"] = checks
    for line in checks:
        print("  " + line)
    print()
    print(f"EXPLAIN ANALYZE of every query at {sizes[-1]:,} runs:")
    for label, plans in explains.items():
        print(f"\n### {label}")
        for text in plans:
            print(text)
    save_result("growth", figures)
    return figures


if __name__ == "__main__":
    main()
