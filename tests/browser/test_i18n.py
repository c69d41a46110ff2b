# ruff: noqa: RUF001  (Chinese text uses full-width punctuation on purpose)
"""The inbox in Chinese in a real browser (issue 8; the rest of the language tests are in
``tests/i18n/``): the seed's Chinese prompt beside our Chinese UI,
countdowns ticking in Chinese from the JavaScript catalog, and the nav's switcher.

A screenshot goes to ``test-output/screenshots/i18n-inbox-zh.png`` (and the English one
beside it) for a person to look at: CJK glyphs, no boxes, nothing overflowing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.browser.conftest import ZONE, PageProblems, login, shot
from tests.dashboard.support import ask
from tests.i18n.test_pages import IRREVERSIBLE_EMAIL, seed_question

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def chinese_page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A page in a browser that asks for Chinese (Accept-Language and navigator.language)."""
    problems = PageProblems()
    context = browser.new_context(
        base_url=live_server.url,
        viewport={"width": 1280, "height": 900},
        timezone_id=ZONE,
        locale="zh-CN",
    )
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.on("console", problems.console)
    page.on("pageerror", problems.page_error)
    yield page
    context.close()
    assert problems.errors == [], "the browser reported problems"


def test_it_shows_the_inbox_in_chinese(chinese_page: Any, approver: User) -> None:
    page = chinese_page
    _run, req = seed_question()
    ask(
        kind="auth_required",
        prompt="发送迁移通知？",
        action=IRREVERSIBLE_EMAIL,
        reason="通知认证团队：旧 Token 将在 30 天后失效",
        step_id="notify",
    )
    page.goto("/login/")
    expect(page.locator("h1")).to_contain_text("Holdpoint")
    expect(page.locator("button[type=submit]")).to_have_text("登录")
    login(page, "alice")
    expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
    expect(page.locator(".page-head h1")).to_have_text("收件箱")
    card = page.locator(f"#request-{req.id}")
    expect(card.locator(".request-title")).to_have_text("请选择需要保持兼容的 Token 版本")
    expect(card.locator("button[data-default-submit]")).to_have_text("提交回答")
    # app.js rewrites the countdown every second with words from /jsi18n/.
    countdown = card.locator(".request-head time[data-countdown]")
    expect(countdown).to_have_text(re.compile(r"^\d+分\d{2}秒后过期$"))
    expect(page.locator(".chip-danger").first).to_have_text("无法撤销")
    expect(page.locator("button[value=approve]")).to_have_text("批准 send_email — 无法撤销")
    # Nothing wider than the window: Chinese labels fit where the English ones did.
    overflow = page.evaluate("document.documentElement.scrollWidth > window.innerWidth")
    assert overflow is False
    shot(page, "i18n-inbox-zh")

    # The switcher: English now, whatever the browser asks for; then back.
    page.select_option("#language", "en")
    expect(page.locator(".page-head h1")).to_have_text("Inbox")
    expect(countdown).to_have_text(re.compile(r"^Expires in \d+m \d{2}s$"))
    shot(page, "i18n-inbox-en")
    page.select_option("#language", "zh-hans")
    expect(page.locator(".page-head h1")).to_have_text("收件箱")
    expect(countdown).to_have_text(re.compile(r"后过期$"))

    # The run page and the runs list, for a person to look at too.
    page.goto(f"/runs/{req.run_id}/")
    expect(page.locator(f"#run-{req.run_id}-status")).to_have_text("等待输入")
    expect(page.locator("#timeline")).to_have_text("时间线")
    expect(page.locator(f"#run-{req.run_id}-side-effects")).to_contain_text("此运行尚未")
    assert page.evaluate("document.documentElement.scrollWidth > window.innerWidth") is False
    shot(page, "i18n-run-zh")
    page.goto("/runs/")
    expect(page.locator(".page-head h1")).to_have_text("运行")
    shot(page, "i18n-runs-zh")
