"""Issue 13, finding 11, in Chromium: a right-to-left override in an approval's target stays
inside the target. The words the dashboard puts after it ("via update_hook") stay where
they belong, to its right, and the target is a bidi isolate (computed style)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.browser.conftest import login, shot
from tests.security.test_bidi import TARGET, approval

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_it_shows_an_rtl_override_target_isolated(page: Any, approver: User) -> None:
    _run, request = approval()
    login(page, "alice")
    title = page.locator(f"#request-{request.id}-title")
    title.wait_for()
    shot(page, "bidi-approval")
    target = title.locator("bdi", has_text="example.com")
    assert target.text_content() == TARGET
    assert target.evaluate("node => getComputedStyle(node).unicodeBidi") == "isolate"
    # Where the text after the target is drawn: a Range over " via " must lie to the right
    # of the target's box (an override leaking out of the target would draw it reversed,
    # to the left of the target's letters).
    boxes = title.evaluate(
        """(h2) => {
            const bdi = h2.querySelectorAll("bdi")[1];  // Update [target] via [name]
            const text = bdi.nextSibling;  // " via "
            const range = document.createRange();
            range.setStart(text, 1);
            range.setEnd(text, 4);
            const via = range.getBoundingClientRect();
            const box = bdi.getBoundingClientRect();
            return {viaLeft: via.left, targetRight: box.right, viaTop: via.top, targetTop: box.top};
        }"""
    )
    assert boxes["viaLeft"] >= boxes["targetRight"] - 0.5, boxes
    assert abs(boxes["viaTop"] - boxes["targetTop"]) < 4, boxes
    # The same target in the approval's facts and the approve button is isolated too.
    facts = page.locator(f"#request-{request.id} .action-facts bdi", has_text="example.com")
    assert facts.count() == 1
    assert facts.first.evaluate("node => getComputedStyle(node).unicodeBidi") == "isolate"
