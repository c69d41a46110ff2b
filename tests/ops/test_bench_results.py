"""`make bench` and `make chaos` write their raw figures to bench/results/<UTC date>.md and
leave the documents alone (docs/performance.md and docs/reliability.md state verdicts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import time_machine

from bench import all as bench_all
from chaos import harness

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/performance.md", "docs/reliability.md")
MACHINE = {"cpus": 2, "python": "3.11.7"}


def _docs() -> dict[str, bytes]:
    return {name: (ROOT / name).read_bytes() for name in DOCS}


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A results folder of its own, with one saved output per script as `make bench` leaves
    them; `machine()` answers without asking any database."""
    monkeypatch.setattr(bench_all, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(bench_all, "machine", lambda: MACHINE)
    monkeypatch.setattr(harness, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(harness, "machine", lambda: MACHINE)
    saved = {
        "wakeup": "p50 3.9 ms (met <= 10 ms)",
        "growth": "dashboard runs: p95 24.6 ms\n\nEXPLAIN ANALYZE of every query at 1M:\nSeq Scan",
    }
    for name, text in saved.items():
        (tmp_path / f"{name}.out.json").write_text(
            json.dumps(
                {
                    "args": ["--samples", "200"] if name == "wakeup" else [],
                    "text": text,
                    "seconds": 23.0,
                    "code": 0,
                    "measured_at": "2026-12-01 09:15 UTC",
                }
            )
        )
    return tmp_path


@time_machine.travel("2026-12-01 09:30:00 +0000", tick=False)
def test_it_writes_the_figures_to_a_file_of_the_utc_date_and_leaves_the_docs_alone(
    results: Path,
) -> None:
    before = _docs()

    assert bench_all.main(["--render-only"]) == 0

    assert _docs() == before
    written = results / "2026-12-01.md"
    text = written.read_text()
    assert text.startswith("# `make bench`, 2026-12-01\n")
    assert "Written 2026-12-01 09:30 UTC" in text
    assert '"cpus": 2' in text
    assert (
        "### `python -m bench.wakeup --samples 200`  (measured 2026-12-01 09:15 UTC, 23 s)" in text
    )
    assert "p50 3.9 ms (met <= 10 ms)" in text
    # The EXPLAIN plans are folded under their own summary.
    assert "<details><summary>EXPLAIN ANALYZE of every query</summary>" in text
    assert "<!--" not in text


def test_it_writes_one_file_per_utc_date(results: Path) -> None:
    with time_machine.travel("2026-12-01 23:59:00 +0000", tick=False):
        bench_all.main(["--render-only"])
    with time_machine.travel("2026-12-02 00:01:00 +0000", tick=False):
        bench_all.main(["--render-only"])

    assert sorted(p.name for p in results.glob("*.md")) == ["2026-12-01.md", "2026-12-02.md"]


def test_it_writes_nothing_with_no_write(results: Path) -> None:
    assert bench_all.main(["--render-only", "--no-write"]) == 0

    assert list(results.glob("*.md")) == []


@time_machine.travel("2026-12-01 15:26:00 +0000", tick=False)
def test_it_writes_the_chaos_report_to_its_own_file_and_leaves_the_docs_alone(
    results: Path,
) -> None:
    before = _docs()

    path = harness.write_results("Chaos run, seed 7: 393 s in all\n0 violations", ["--seed", "7"])

    assert _docs() == before
    assert path == results / "2026-12-01-chaos.md"
    text = path.read_text()
    assert text.startswith("# `make chaos`, 2026-12-01\n")
    assert "`python -m chaos.harness --seed 7`" in text
    assert "(2026-12-01 15:26 UTC; machine: " in text
    assert "Chaos run, seed 7: 393 s in all\n0 violations" in text


@time_machine.travel("2026-12-01 09:30:00 +0000", tick=False)
def test_it_prints_and_writes_every_judged_target_missed_first(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judged = {
        "wakeup": ["p50 3.9 ms (met <= 10 ms); procrastinate p50 1.8 ms"],
        "growth": [
            "API runs: p95 12.9 ms at 1,000,000 (met < 100 ms)",
            "dashboard runs: p95 240 ms at 1,000,000 (MISSED < 100 ms) | a pipe",
            "a figure beside a target judged elsewhere: 5.7 s",
        ],
    }
    for name, sentences in judged.items():
        (results / f"{name}.json").write_text(
            json.dumps({"measured_at": "2026-12-01T09:15:00Z", "targets": sentences})
        )

    assert bench_all.main(["--render-only"]) == 0

    printed = capsys.readouterr().out
    written = (results / "2026-12-01.md").read_text()
    for text in (printed, written):
        assert "## Targets: 2 met, 1 missed" in text
        rows = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
        assert [row.split(" | ")[0] for row in rows] == ["| MISSED", "| met", "| met", "| -"]
        assert rows[0] == (
            "| MISSED | `growth` | dashboard runs: p95 240 ms at 1,000,000 (MISSED < 100 ms) "
            "/ a pipe | 2026-12-01T09:15:00Z |"
        )
