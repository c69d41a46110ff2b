"""What a 1 GiB request body costs the web process: its memory before and after.

Starts the web process exactly as the Procfile's ``web`` line does (uvicorn serving
``config.asgi``, one worker process: ``WEB_CONCURRENCY=1``), or its ``live`` line
(``--process live``: daphne), sends one body of ``--size`` bytes with a ``Content-Length`` and one
chunked, each as fast as loopback takes it, and reads the process's resident memory
(``VmRSS``) and peak (``VmHWM``) from /proc before and after. Acceptance (issue 13): the
web process stays within +20 MiB. Without the guard (``config/body_limit.py``) daphne
read the whole body and queued it in memory: +910 MiB for 1 GiB in the issue's report.

    python -m bench.body_limit [--process web|live] [--size 1GiB] [--limit-mib 20]

Needs nothing but this repository (SQLite unless ``DATABASE_URL`` is set; no request
reaches the database). Writes bench/results/body_limit.json; exits 1 over the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, ROOT, free_port, stop_process, wait_for_http

MIB = 1024 * 1024
PIECE = MIB


def procfile_line(process: str) -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, _, command = line.partition(":")
        if name.strip() == process:
            return command.strip()
    raise SystemExit(f"the Procfile has no {process} line")


def memory(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = {k: int(v) / 1024 for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return {"rss_mib": round(values["VmRSS"], 1), "peak_mib": round(values["VmHWM"], 1)}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*(GiB|MiB|KiB|B)?", text.strip())
    if not match:
        raise SystemExit(f"--size {text!r}: use e.g. 1GiB, 200MiB")
    unit = {"GiB": 1024**3, "MiB": MIB, "KiB": 1024, "B": 1, None: 1}[match.group(2)]
    return int(match.group(1)) * unit


def send_body(port: int, size: int, *, chunked: bool) -> dict[str, Any]:
    """Send ``size`` bytes as one request body; return what was sent and the answer."""
    head = b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += (
        b"Transfer-Encoding: chunked\r\n\r\n"
        if chunked
        else f"Content-Length: {size}\r\n\r\n".encode()
    )
    piece = b"0" * PIECE
    framed = f"{PIECE:x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    sent = 0
    started = time.monotonic()
    stopped_by = "complete"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        try:
            while sent < size:
                sock.sendall(framed)
                sent += PIECE
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except OSError as exc:
            stopped_by = f"server closed ({type(exc).__name__})"
        answer = b""
        try:
            while b"\r\n" not in answer:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
        except OSError:
            pass
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1") if answer else "(no answer)"
    return {
        "framing": "chunked" if chunked else "content-length",
        "body_bytes": size,
        "bytes_sent_before_stop": sent,
        "sending": stopped_by,
        "answer": status_line,
        "seconds": round(time.monotonic() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--process", default="web", choices=["web", "live"])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--limit-mib", type=float, default=20.0)
    opts = parser.parse_args(argv)
    size = parse_size(opts.size)
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "LIVE_PORT": str(port),
        "WEB_CONCURRENCY": "1",  # uvicorn in one process: the one measured
        "LOG_LEVEL": "WARNING",
    }
    web = procfile_line(opts.process)
    # exec: the process measured is the server itself, not a shell around it.
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {web}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", timeout=60)
        # One ordinary request first, so that what Django loads lazily is loaded.
        send_body(port, 16, chunked=False)
        time.sleep(1)
        before = memory(proc.pid)
        results = []
        for chunked in (False, True):
            result = send_body(port, size, chunked=chunked)
            time.sleep(2)  # Let the server finish with the connection.
            result["after"] = memory(proc.pid)
            results.append(result)
        after = memory(proc.pid)
    finally:
        stop_process(proc)
    growth = round(after["rss_mib"] - before["rss_mib"], 1)
    peak_growth = round(after["peak_mib"] - before["peak_mib"], 1)
    ok = growth <= opts.limit_mib and peak_growth <= opts.limit_mib
    report = {
        "web": web,
        "body": opts.size,
        "before": before,
        "after": after,
        "rss_growth_mib": growth,
        "peak_growth_mib": peak_growth,
        "limit_mib": opts.limit_mib,
        "ok": ok,
        "requests": results,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    suffix = "" if opts.process == "web" else f"-{opts.process}"
    (RESULTS_DIR / f"body_limit{suffix}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{opts.process} process: {web}")
    print(
        f"| request ({opts.size} body) | answer | sent before the server stopped it | RSS after |"
    )
    print("|---|---|---|---|")
    for r in results:
        print(
            f"| {r['framing']} | {r['answer']} | {r['bytes_sent_before_stop'] / MIB:,.0f} MiB "
            f"({r['sending']}) | {r['after']['rss_mib']} MiB |"
        )
    print(
        f"RSS {before['rss_mib']} -> {after['rss_mib']} MiB ({growth:+} MiB); peak "
        f"{before['peak_mib']} -> {after['peak_mib']} MiB ({peak_growth:+} MiB); "
        f"limit +{opts.limit_mib} MiB: {'ok' if ok else 'OVER'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
