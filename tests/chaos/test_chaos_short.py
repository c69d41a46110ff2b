"""The short chaos run (about 2 minutes): real web server and workers, kills, freezes,
duplicate control requests, a PostgreSQL restart; every invariant must hold.

The harness starts its own PostgreSQL cluster (it restarts it half-way, which must
not disturb anyone else's database), so this test needs the PostgreSQL server
binaries; it is marked ``postgres`` so that CI, which has them, always runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
@pytest.mark.process
@pytest.mark.timeout(420)
def test_it_keeps_every_invariant_through_the_short_chaos_run(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    result = subprocess.run(
        [sys.executable, "-m", "chaos.harness", "--short", "--result", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    report = result.stdout[-8000:] + "\n" + result.stderr[-4000:]
    assert result.returncode == 0, report
    figures = json.loads(out.read_text())
    # The faults really happened, and every invariant was looked at and held.
    assert figures["runs"] >= 1000, report
    assert figures["kills"] >= 15, report
    assert figures["pg_restarts"] == 1, report
    assert figures["control_requests"] > 0, report
    # Notifications were sent and counted (issue 18): at most once per key, none lost.
    assert figures["checks"]["no notification was lost"]["checked"] > 0, report
    assert all(c["violations"] == 0 for c in figures["checks"].values()), report
    assert figures["checks"]["event seq gap-free per run"]["checked"] >= 1000, report
    # A share of the runs went through the Python client (holdpoint-worker processes,
    # killed and frozen like the others), under the same invariants, and got somewhere.
    assert figures["runs_by_agent"]["chaos-remote"] >= 100, report
    remote = figures["remote_runs_by_status"]
    assert sum(n for s, n in remote.items() if s not in ("queued", "running")) > 0, report
