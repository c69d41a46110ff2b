"""Screenshots of every dashboard page: desktop (1280 x 800) and phone (390 x 844), English and
Chinese, into ``var/screenshots/`` (ignored by git). ``make screenshots`` runs this.

It starts its own Holdpoint (``manage.py serve``: web server, workers, demo agents and the
demo runs) on a throwaway SQLite database and config store in a temporary directory, waits
until the demo runs have reached their states, then walks the pages with Playwright and
Chromium (``/usr/bin/chromium``; ``bash scripts/ensure-chromium`` installs it). Nothing of
the developer's own database is touched. Each page is also checked for sideways scrolling;
the script lists the pages that scroll and exits non-zero when one does.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "screenshots-demo"
SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
LANGUAGES = {"en": "en", "zh": "zh-hans"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "CHANNEL_PREFIX", "HOLDPOINT_PRODUCTION")
    }
    env.update(
        HOLDPOINT_VAR_DIR=str(tmp / "var"),
        HOLDPOINT_CONFIG_STORE_DIR=str(tmp / "config-store"),
        HOLDPOINT_DEMO_PASSWORD=PASSWORD,
    )
    log = open(tmp / "serve.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(  # noqa: S603 - our own manage.py, no shell
        [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:  # noqa: S310 - http://127.0.0.1
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"screenshots: {url} did not answer within {seconds:.0f}s")


def login(page: Any, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def wait_for_demo(page: Any, seconds: float) -> None:
    """Until the demo runs show a question, an approval and a finished run."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        page.goto("/?tab=all")
        rows = page.locator("#inbox-list .inbox-row").count()
        page.goto("/runs/?status=succeeded")
        done = page.locator("#runs-rows a.run-label").count()
        if rows >= 2 and done >= 1:
            return
        time.sleep(2)
    print("screenshots: the demo runs did not all reach their states; taking what is there")


def run_links(page: Any) -> list[str]:
    page.goto("/runs/")
    hrefs = page.eval_on_selector_all(
        "#runs-rows a.run-label", "els => els.map(e => e.getAttribute('href'))"
    )
    return [h for h in dict.fromkeys(hrefs) if h][:8]


def pages(page: Any) -> list[tuple[str, str]]:
    found = [
        ("inbox", "/"),
        ("inbox-all", "/?tab=all"),
        ("inbox-answered", "/?tab=answered"),
        ("inbox-expired", "/?tab=expired"),
        ("runs", "/runs/"),
        ("start", "/runs/new"),
        ("side-effects", "/side-effects/"),
        ("side-effects-all", "/side-effects/?tab=all"),
        ("not-found", "/runs/run_does_not_exist/"),
    ]
    for href in run_links(page):
        run_id = href.strip("/").split("/")[-1]
        found.append((f"run-{run_id[-6:]}", href))
        found.append((f"report-{run_id[-6:]}", f"/side-effects/runs/{run_id}/"))
    return found


def open_first_details(page: Any) -> None:
    """Open the first closed row, undo panel and details, so the shot shows what they hold."""
    for selector in (
        "#inbox-list details.inbox-group:not([open]) > summary",
        "details.control:not([open]) > summary",
    ):
        found = page.locator(selector)
        if found.count() and found.first.is_visible():
            found.first.click()


def shoot(base_url: str, out: Path, *, username: str) -> list[str]:
    from playwright.sync_api import sync_playwright

    sideways: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"))
        probe = browser.new_context(base_url=base_url)
        first = probe.new_page()
        login(first, username)
        wait_for_demo(first, 120)
        targets = pages(first)
        probe.close()
        for size, viewport in SIZES.items():
            for lang, code in LANGUAGES.items():
                context = browser.new_context(
                    base_url=base_url,
                    viewport=viewport,
                    locale="zh-CN" if lang == "zh" else "en-US",
                    timezone_id="Asia/Shanghai",
                )
                context.add_cookies([{"name": "django_language", "value": code, "url": base_url}])
                page = context.new_page()
                page.goto("/login/")
                page.screenshot(path=str(out / f"{size}-{lang}-login.png"), full_page=True)
                login(page, username)
                for name, url in targets:
                    page.goto(url)
                    page.wait_for_timeout(300)
                    if name.startswith(("inbox", "report", "run-")):
                        open_first_details(page)
                    widths = page.evaluate(
                        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
                    )
                    if widths[0] > widths[1]:
                        sideways.append(f"{size}-{lang}-{name} ({url}): {widths[0]} > {widths[1]}")
                    page.screenshot(path=str(out / f"{size}-{lang}-{name}.png"), full_page=True)
                context.close()
        browser.close()
    return sideways


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "var" / "screenshots"))
    parser.add_argument("--user", default="admin", help="Demo account to look as.")
    parser.add_argument("--keep", action="store_true", help="Keep the throwaway directory.")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp(prefix="holdpoint-screenshots-"))
    port = free_port()
    server = start_server(tmp, port)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", 120)
        sideways = shoot(f"http://127.0.0.1:{port}", out, username=args.user)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    shots = sorted(out.glob("*.png"))
    print(f"screenshots: {len(shots)} pages in {out}")
    for line in sideways:
        print(f"screenshots: scrolls sideways: {line}")
    return 1 if sideways else 0


if __name__ == "__main__":
    sys.exit(main())
