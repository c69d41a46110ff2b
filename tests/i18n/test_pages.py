# ruff: noqa: RUF001, RUF003  (Chinese text uses full-width punctuation on purpose)
"""The dashboard speaks Simplified Chinese to a browser that asks for it (docs/dashboard.md).

The language comes from the browser (``Accept-Language: zh-CN``) or from the switcher in
the nav (Django's ``set_language``, a cookie); English stays the default. Only our UI is
translated: what agents send (the seed's Chinese prompt, context, targets) is shown as it
came.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from runs import services
from runs.models import Run
from tests.dashboard.support import ask, card_html, text
from tests.dashboard.test_side_effects import a_run_with_effects, config_dir
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

__all__ = ["config_dir"]  # a fixture, used by name

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9,en;q=0.8"}
EN = {"HTTP_ACCEPT_LANGUAGE": "en-US,en;q=0.9"}
SEED_PROMPT = "请选择需要保持兼容的 Token 版本"
SEED_SCHEMA = {
    "type": "object",
    "properties": {
        "versions": {
            "type": "array",
            "title": "兼容版本",
            "items": {"type": "string", "enum": ["v1", "v2", "v3"]},
            "minItems": 1,
        },
        "grace_days": {"type": "integer", "title": "Grace days", "minimum": 1},
    },
    "required": ["versions", "grace_days"],
}
IRREVERSIBLE_EMAIL = {
    "tool": "email",
    "action": "send_email",
    "target": "auth-team@example.com",
    "reversibility": "irreversible",
}


def seed_question() -> tuple[Run, Any]:
    run, _lease, _cp, req = ask(
        prompt=SEED_PROMPT,
        schema=SEED_SCHEMA,
        context={"service": "auth-gateway", "说明": "旧版本仍有流量"},
        step_id="choose_versions",
    )
    return run, req


def lang(html: str) -> str:
    match = re.search(r'<html lang="([^"]+)">', html)
    assert match
    return match.group(1)


def test_it_renders_the_inbox_in_chinese_for_a_chinese_browser(
    client: Client, approver: User
) -> None:
    _run, req = seed_question()
    _run2, _lease, _cp, approval = ask(
        kind="auth_required", prompt="Send the migration notice?", action=IRREVERSIBLE_EMAIL
    )
    client.force_login(approver)
    html = text(client.get("/", **ZH))
    assert lang(html) == "zh-hans"
    for words in (
        "<title>收件箱 · Holdpoint</title>",
        ">收件箱<",
        "待我处理",
        "全部待处理",
        "提交回答",
        "运行</a>",
        ">副作用</a>",
        "后过期",  # the countdown: "59分59秒后过期"
        "提问于",
        "退出登录",
    ):
        assert words in html, words
    question = card_html(html, req.id)
    assert '<span class="chip chip-input">输入</span>' in question
    # The agent's words stay exactly as they came: prompt, field titles, context.
    assert SEED_PROMPT in question and "兼容版本" in question and "Grace days" in question
    assert "旧版本仍有流量" in question and "auth-gateway" in question
    decision = card_html(html, approval.id)
    assert '<span class="chip chip-approval">审批</span>' in decision
    assert '<span class="chip chip-danger">无法撤销</span>' in decision
    assert "批准 <bdi>send_email</bdi> — 无法撤销" in decision
    assert "拒绝 <bdi>send_email</bdi>" in decision
    assert "auth-team@example.com" in decision
    for english in ("Submit response", "Needs me", "Cannot be undone", "Expires in", "Deny "):
        assert english not in html, english


def test_it_stays_english_by_default(client: Client, approver: User) -> None:
    seed_question()
    client.force_login(approver)
    for headers in ({}, EN, {"HTTP_ACCEPT_LANGUAGE": "fr-FR,fr;q=0.9"}):
        html = text(client.get("/", **headers))
        assert lang(html) == "en"
        assert "Needs me" in html and "Submit response" in html and "Expires in" in html
        assert "收件箱" not in html and "提交回答" not in html
        assert SEED_PROMPT in html


def test_it_switches_language_with_the_nav_switcher(client: Client, viewer: User) -> None:
    client.force_login(viewer)
    html = text(client.get("/runs/", **EN))
    assert 'action="/i18n/setlang/"' in html
    assert '<option value="zh-hans" >简体中文</option>' in html
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/runs/"}, **EN)
    assert response.status_code == 302 and response["Location"] == "/runs/"
    assert client.cookies["django_language"].value == "zh-hans"
    # The choice beats the browser's language from now on.
    html = text(client.get("/runs/", **EN))
    assert lang(html) == "zh-hans"
    assert "<h1>运行</h1>" in html and "所有运行，最新的在前。" in html
    assert '<option value="zh-hans" selected>简体中文</option>' in html
    client.post("/i18n/setlang/", {"language": "en", "next": "/runs/"}, **ZH)
    html = text(client.get("/runs/", **ZH))
    assert lang(html) == "en" and "<h1>Runs</h1>" in html


def test_it_says_every_status_word_in_chinese(client: Client, operator: User) -> None:
    """Status words (docs/dashboard.md), in Chinese: each run status as a person reads it, in the list and on the page."""
    runs: dict[str, Run] = {}
    runs["queued"] = start()
    services.run_cancel(run_id=runs["queued"].id, reason="not needed")  # cancelled at once
    runs["cancelled"] = runs.pop("queued")
    runs["succeeded"] = start()
    services.attempt_complete(**epochs(claim()), result={"ok": True})
    runs["failed"] = start()
    services.attempt_fail(**epochs(claim()), error={"type": "ValueError", "message": "bad n"})
    runs["cancelling"] = start()
    claim()
    services.run_cancel(run_id=runs["cancelling"].id, reason="wrong input")
    runs["input"], _lease, _cp, _req = ask()
    runs["approval"], _lease, _cp, _req = ask(kind="auth_required")
    runs["running"] = start()
    claim()
    # Last of the claims: its retry is due at once and the next claim would take it.
    runs["waiting"] = start()
    services.attempt_fail(**epochs(claim()), error={"type": "Timeout", "message": "slow"})
    runs["queued"] = start()
    expected = {
        "cancelled": "已取消",
        "succeeded": "成功",
        "failed": "失败（需要新信息）",
        "waiting": "退避中（",  # 退避中（14:05 重试）
        "cancelling": "取消中…",
        "input": "等待输入",
        "approval": "等待审批",
        "running": "运行中",
        "queued": "排队中",
    }
    client.force_login(operator)
    listing = text(client.get("/runs/", **ZH))
    for name, words in expected.items():
        run = Run.objects.get(pk=runs[name].id)
        row = listing[listing.index(f'id="run-{run.id}-row"') :]
        status = re.search(r'data-status="[a-z_]+">([^<]+)</span>', row)
        assert status and status.group(1).startswith(words), (name, status)
        page = text(client.get(f"/runs/{run.id}/", **ZH))
        assert f'data-status="{run.status}">{words}' in page, name
    waiting = Run.objects.get(pk=runs["waiting"].id)
    assert waiting.not_before is not None
    clock = timezone.localtime(waiting.not_before).strftime("%H:%M %Z")
    assert f"退避中（{clock} 重试）" in listing
    # The status tabs with their counts are Chinese too.
    for tab in ("全部", "等待输入", "等待审批", "退避中", "取消中…", "已取消", "失败", "成功"):
        assert f">{tab} <span" in listing, tab


def test_it_renders_the_run_page_in_chinese(client: Client, operator: User) -> None:
    run, _req = seed_question()
    client.force_login(operator)
    html = text(client.get(f"/runs/{run.id}/", **ZH))
    for words in (
        "智能体",
        "技术细节",
        "执行器交接次数",
        "取消运行…",
        "等待人工处理",
        "尝试",
        "首次",  # the first attempt's reason
        "检查点",
        "时间线",
        "人工决定",
        f"已为智能体 {run.agent} 创建运行。",
        "在步骤 choose_versions 暂停，等待输入。",
        "打开副作用报告",
        "若 ",  # 若 16:00 UTC 前无人回答：运行将失败。
        "前无人回答：运行将失败。",
    ):
        assert words in html, words
    assert SEED_PROMPT in html
    for english in ("Cancel run…", "Timeline", "Checkpoints", "Lease epoch", "Technical details"):
        assert english not in html, english
    assert "纪元" not in html  # no internal jargon in Chinese (issue 15)


def test_it_explains_invalid_answers_in_chinese(client: Client, operator: User) -> None:
    _run, req = seed_question()
    client.force_login(operator)
    response = client.post(
        f"/runs/{req.run_id}/requests/{req.id}/answer",
        {
            "idempotency_key": "zh-invalid",
            "run_id": req.run_id,
            "request_id": req.id,
            "checkpoint_id": req.checkpoint_id,
            "origin": "inbox",
        },
        HTTP_HX_REQUEST="true",
        **ZH,
    )
    assert response.status_code == 422
    html = text(response)
    assert "请检查标出的字段。未向运行发送任何内容。" in html
    assert "此字段为必填项。" in html


def test_it_shows_times_in_the_users_zone_with_chinese_dates(
    client: Client, approver: User
) -> None:
    _run, _lease, _cp, req = ask(expires_in=3 * 86400)
    client.force_login(approver)
    client.cookies["tz"] = "Asia/Shanghai"
    card = card_html(text(client.get("/", **ZH)), req.id)
    local = timezone.localtime(req.expires_at, dt.timezone(dt.timedelta(hours=8)))
    # Another day: "12月2日 20:00 CST", not "十二月 2, 20:00".
    assert f"若 {local.month}月{local.day}日 {local:%H:%M} CST 前无人回答：运行将失败。" in card
    assert "2天23小时后过期" in card


def test_it_translates_why_a_request_was_closed(client: Client, approver: User) -> None:
    """The services store "Closed: run cancelled" in English; it is shown in the reader's."""
    run, req = seed_question()
    services.run_cancel(run_id=run.id, reason="wrong environment")
    client.force_login(approver)
    card = card_html(text(client.get("/?tab=expired", **ZH)), req.id)
    assert "已关闭：运行已取消" in card and "Closed" not in card
    card = card_html(text(client.get("/?tab=expired", **EN)), req.id)
    assert "Closed: run cancelled" in card


def test_it_renders_the_login_page_in_chinese(client: Client) -> None:
    html = text(client.get("/login/", **ZH))
    assert lang(html) == "zh-hans"
    for words in ("<title>登录 · Holdpoint</title>", "用户名", "密码", "回答智能体的问题"):
        assert words in html, words
    assert "Username" not in html
    assert "Username" in text(client.get("/login/", **EN))


def test_it_renders_the_side_effect_pages_in_chinese(
    client: Client, operator: User, config_dir: Path
) -> None:
    run, effects = a_run_with_effects(config_dir)
    client.force_login(operator)
    html = text(client.get("/side-effects/", **ZH))
    for words in (
        "<h1>副作用</h1>",
        "需要核实",
        "未知 — 需要核实",
        "标记为已发生",
        "标记为未发生",
        "去重键",
        "外部编号",
        "（你核实了什么，如何核实）",
    ):
        assert words in html, words
    assert effects["unknown"].idempotency_key in html  # ours to show, not to translate
    report = text(client.get(f"/side-effects/runs/{run.id}/", **ZH))
    for group in ("未知 — 需要核实", "无法撤销", "已发生", "已撤销", "未发生"):
        assert f"{group} <span" in report, group
    assert "1 个副作用需要核实" in report
    # The retry guard of the ledger explains itself in Chinese on the run page.
    page = text(client.get(f"/runs/{run.id}/", **ZH))
    assert "此运行有副作用需要先核实：1 个结果未知。" in page
    assert "失败（副作用结果未知）" in page


def messages_of(catalog: str) -> dict[str, str]:
    """The translations a JavaScriptCatalog script carries (a JSON object literal)."""
    match = re.search(r"const newcatalog = (\{.*?\});", catalog, re.S)
    return json.loads(match.group(1)) if match else {}


def test_it_serves_app_js_words_from_the_javascript_catalog(client: Client, viewer: User) -> None:
    client.force_login(viewer)
    html = text(client.get("/", **ZH))
    # A script file before app.js (CSP allows no inline script); the URL names the language
    # so a cached English catalog never serves a Chinese page.
    scripts = re.findall(r'<script src="([^"]+)" defer></script>', html)
    assert scripts[-2:] == ["/jsi18n/?lang=zh-hans", scripts[-1]]
    assert scripts[-1].endswith("holdpoint/app.js")
    catalog = client.get("/jsi18n/?lang=zh-hans", **ZH)
    assert catalog.status_code == 200
    assert catalog["Content-Type"].startswith("text/javascript")
    words = messages_of(catalog.content.decode())
    assert words["Expires in {}"] == "{}后过期"
    assert words["%(h)sh %(m)sm"] == "%(h)s小时%(m)s分"
    assert words["%(m)sm %(s)ss"] == "%(m)s分%(s)s秒"
    assert words["That did not work ({}). Reload the page and try again."].startswith("操作未成功")
    assert messages_of(client.get("/jsi18n/?lang=en", **EN).content.decode()) == {}
    # Revalidation answers 304 until the server restarts.
    again = client.get(
        "/jsi18n/?lang=zh-hans", HTTP_IF_MODIFIED_SINCE=catalog["Last-Modified"], **ZH
    )
    assert again.status_code == 304


@pytest.mark.parametrize("asked", ["zh", "zh-CN", "zh-Hans-CN", "zh-SG", "zh-TW"])
def test_it_picks_chinese_for_any_chinese_browser(client: Client, asked: str) -> None:
    html = text(client.get("/login/", HTTP_ACCEPT_LANGUAGE=asked))
    assert lang(html) == "zh-hans" and "用户名" in html
