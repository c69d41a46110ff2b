"""Run every benchmark (``make bench``) and write their output into docs/performance.md.

Each script runs in its own process (each works in its own scratch database) and
prints its figures next to its baseline or peer; this collects what they printed
into the "Latest figures" section of docs/performance.md, between the markers, with
the machine and the commands.

    python -m bench.all [--sizes 10k,100k,1M] [--quick] [--only control_ops,wakeup]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from bench.common import PYTHON, RESULTS_DIR, ROOT, base_database_url, machine

DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def scripts(opts: argparse.Namespace) -> list[tuple[str, list[str]]]:
    quick = opts.quick
    return [
        ("control_ops", ["--requests", "50" if quick else "200"]),
        ("worker_cycle", ["--runs", "1000" if quick else "5000"]),
        ("wakeup", ["--samples", "100" if quick else "200"]),
        ("latencies", ["--samples", "10" if quick else "30", "--kills", "2" if quick else "5"]),
        ("push", []),
        ("pause", ["--samples", "20" if quick else "50", "--attempts", "100"]),
        ("growth", ["--sizes", opts.sizes or ("10k,100k" if quick else "10k,100k,1M")]),
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


def render(outputs: list[tuple[str, list[str], str, float, int, str | None]]) -> str:
    info = machine()
    parts = [
        BEGIN,
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `make bench` "
        "(`python -m bench.all`); each block says when it was measured.",
        "",
        "Machine: " + json.dumps(info, sort_keys=True),
        "",
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
    parts.append(END)
    return "\n".join(parts)


def _progress_free(text: str) -> str:
    return "\n".join(
        line for line in text.splitlines() if not re.match(r"^\s*(preparing|prepared) ", line)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", help="growth sizes (default 10k,100k,1M)")
    parser.add_argument("--quick", action="store_true", help="smaller counts, for a first look")
    parser.add_argument("--only", help="comma-separated script names")
    parser.add_argument("--no-docs", action="store_true", help="do not touch docs/performance.md")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing; write the saved outputs into the docs",
    )
    opts = parser.parse_args(argv)
    if not opts.render_only:
        base_database_url()  # exits with a clear message without PostgreSQL
    if not os.environ.get("REDIS_URL"):
        print("note: REDIS_URL is not set; bench.push will say so and be skipped")
    only = set(opts.only.split(",")) if opts.only else None
    outputs = []
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
    if not opts.no_docs:
        section = render(outputs)
        doc = DOC.read_text() if DOC.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
        if BEGIN in doc and END in doc:
            doc = doc[: doc.index(BEGIN)] + section + doc[doc.index(END) + len(END) :]
        else:
            doc += "\n## Latest figures\n\n" + section + "\n"
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(doc)
        print(f"\nwrote the figures into {DOC.relative_to(ROOT)}")
    failed = [name for name, _, _, _, code, _ in outputs if code and (not only or name in only)]
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
