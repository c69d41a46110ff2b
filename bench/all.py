"""Run every benchmark (``make bench``) and write their output to bench/results/<UTC date>.md.

Each script runs in its own process (each works in its own scratch database) and
prints its figures next to its baseline or peer; this collects what they printed,
with the machine and the commands, into one Markdown file per UTC date
(``bench/results/2026-11-29.md``). The documents are not touched: docs/performance.md
states the targets and verdicts and links to the latest results file.

    python -m bench.all [--sizes 10k,100k,1M] [--quick] [--only control_ops,wakeup]
    python -m bench.all --render-only    # run nothing; write the saved outputs again
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.common import PYTHON, RESULTS_DIR, ROOT, base_database_url, machine


def scripts(opts: argparse.Namespace) -> list[tuple[str, list[str]]]:
    quick = opts.quick
    return [
        ("request_cost", ["--requests", "100" if quick else "300"]),
        ("control_ops", ["--requests", "50" if quick else "200"]),
        ("servers", ["--requests", "50" if quick else "200"]),
        ("prefect_peer", ["--requests", "50" if quick else "200"]),
        ("worker_cycle", ["--runs", "1000" if quick else "5000"]),
        ("remote_cycle", ["--runs", "200" if quick else "1000"]),
        (
            "capacity",
            ["--agents", "100", "--seconds", "30"]
            if quick
            else ["--agents", "1000", "--seconds", "300"],
        ),
        ("wakeup", ["--samples", "100" if quick else "200"]),
        ("latencies", ["--samples", "10" if quick else "30", "--kills", "2" if quick else "5"]),
        ("push", []),
        ("run_timeline", ["--samples", "10" if quick else "30"]),
        ("pause", ["--samples", "20" if quick else "50", "--attempts", "100"]),
        ("growth", ["--sizes", opts.sizes or ("10k,100k" if quick else "10k,100k,1M")]),
        ("partitions", ["--events", "1M" if quick else "10M"]),
    ]


def run(name: str, args: list[str]) -> tuple[str, float, int]:
    command = [PYTHON, "-m", f"bench.{name}", *args]
    print(f"\n$ python -m bench.{name} {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if "staticfiles.W004" in line or line.startswith(("System check", "WARNINGS:")):
            continue
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    return "".join(lines).strip(), time.monotonic() - t0, proc.wait()


# (script, its arguments, what it printed, seconds, exit status, when it was measured)
Output = tuple[str, list[str], str, float, int, str | None]


def results_path(now: time.struct_time | None = None) -> Path:
    """The results file of the UTC date ``now`` (default: today): one file per date."""
    return RESULTS_DIR / f"{time.strftime('%Y-%m-%d', now or time.gmtime())}.md"


def render(outputs: list[Output], now: time.struct_time | None = None) -> str:
    now = now or time.gmtime()
    info = machine()
    parts = [
        f"# `make bench`, {time.strftime('%Y-%m-%d', now)}",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', now)} by `make bench` "
        "(`python -m bench.all`); each block says when it was measured. What the figures "
        "mean, the targets and the verdicts: [docs/performance.md](../../docs/performance.md).",
        "",
        "Machine: " + json.dumps(info, sort_keys=True),
        "",
        render_targets(targets([name for name, *_ in outputs])),
    ]
    for name, args, text, seconds, code, measured_at in outputs:
        command = f"python -m bench.{name} {' '.join(args)}".strip()
        when = f"measured {measured_at}, " if measured_at else ""
        parts.append(f"### `{command}`  ({when}{seconds:.0f} s{', FAILED' if code else ''})")
        parts.append("")
        # The EXPLAIN plans are long: fold them.
        if "EXPLAIN ANALYZE of every query" in text:
            head, plans = text.split("EXPLAIN ANALYZE of every query", 1)
            parts += ["```text", _progress_free(head).strip(), "```", ""]
            parts += [
                "<details><summary>EXPLAIN ANALYZE of every query</summary>",
                "",
                "```text",
                "EXPLAIN ANALYZE of every query" + plans,
                "```",
                "",
                "</details>",
                "",
            ]
        else:
            parts += ["```text", _progress_free(text), "```", ""]
    return "\n".join(parts).rstrip() + "\n"


def targets(names: list[str]) -> list[tuple[str, str, str, str]]:
    """Every target the scripts judged, from their saved figures (``bench/results/<name>.json``,
    key ``targets``: one sentence per target with its figure, its verdict and the baseline
    or peer beside it): ``(script, verdict, sentence, measured_at)``. A sentence with a
    MISSED part is missed; one with only met parts is met; one with neither says no verdict
    (a figure shown next to a target that is judged elsewhere)."""
    found = []
    for name in names:
        path = RESULTS_DIR / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for sentence in data.get("targets") or []:
            judged = (
                "MISSED"
                if re.search(r"\bMISSED\b", sentence)
                else ("met" if re.search(r"\bmet\b", sentence) else "-")
            )
            found.append((name, judged, sentence, str(data.get("measured_at", ""))))
    return found


def render_targets(found: list[tuple[str, str, str, str]]) -> str:
    """The targets as a Markdown table, the missed ones first."""
    met = sum(1 for _, judged, _, _ in found if judged == "met")
    missed = sum(1 for _, judged, _, _ in found if judged == "MISSED")
    lines = [
        f"## Targets: {met} met, {missed} missed",
        "",
        "| verdict | script | target, figure and baseline or peer | measured |",
        "|---|---|---|---|",
    ]
    order = {"MISSED": 0, "met": 1}
    for name, judged, sentence, when in sorted(found, key=lambda t: order.get(t[1], 2)):
        lines.append(f"| {judged} | `{name}` | {sentence.replace('|', '/')} | {when} |")
    return "\n".join(lines) + "\n"


def write_results(outputs: list[Output], now: time.struct_time | None = None) -> Path:
    """Write the raw figures to ``bench/results/<UTC date>.md`` (a second run that day
    replaces the file; every block in it carries its own time)."""
    path = results_path(now)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(outputs, now))
    return path


def _progress_free(text: str) -> str:
    return "\n".join(
        line for line in text.splitlines() if not re.match(r"^\s*(preparing|prepared) ", line)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", help="growth sizes (default 10k,100k,1M)")
    parser.add_argument("--quick", action="store_true", help="smaller counts, for a first look")
    parser.add_argument("--only", help="comma-separated script names")
    parser.add_argument(
        "--no-write", action="store_true", help="print only; write no bench/results/<date>.md"
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing; write the saved outputs to bench/results/<date>.md",
    )
    opts = parser.parse_args(argv)
    if not opts.render_only:
        base_database_url()  # exits with a clear message without PostgreSQL
    if not os.environ.get("REDIS_URL"):
        print("note: REDIS_URL is not set; bench.push will say so and be skipped")
    only = set(opts.only.split(",")) if opts.only else None
    outputs: list[Output] = []
    for name, args in scripts(opts):
        if opts.render_only or (only and name not in only):
            continue
        if name == "push" and not os.environ.get("REDIS_URL"):
            continue
        text, seconds, code = run(name, args)
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / f"{name}.out.json").write_text(
            json.dumps(
                {
                    "args": args,
                    "text": text,
                    "seconds": seconds,
                    "code": code,
                    "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                }
            )
            + "\n"
        )
    # Every script's latest output, so that --only refreshes one and keeps the others.
    for name, _ in scripts(opts):
        saved = RESULTS_DIR / f"{name}.out.json"
        if saved.exists():
            data = json.loads(saved.read_text())
            outputs.append(
                (
                    name,
                    data["args"],
                    data["text"],
                    data["seconds"],
                    data["code"],
                    data.get("measured_at"),
                )
            )
    print("\n" + render_targets(targets([name for name, *_ in outputs])))
    if not opts.no_write and outputs:
        path = write_results(outputs)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"\nwrote the figures to {shown}")
    failed = [name for name, _, _, _, code, _ in outputs if code and (not only or name in only)]
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
