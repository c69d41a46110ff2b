"""How an approval's action and the timeline's events read: nothing an agent sends is dropped."""

from __future__ import annotations

import datetime as dt

from dashboard.present import DiffLine, context_items, describe_action, expires_text, span


def test_it_titles_an_action_by_its_verb_target_and_name() -> None:
    view = describe_action(
        {
            "tool": "config_store",
            "action": "update_auth_config",
            "target": "staging/auth/config",
            "change": {
                "accepted_versions": {"from": ["v1", "v2"], "to": ["v2"]},
                "base_version": 3,
            },
            "reversibility": "reversible",
        }
    )
    assert view.title == "Update staging/auth/config via update_auth_config"
    assert (view.name, view.tool, view.reversibility) == (
        "update_auth_config",
        "config_store",
        "reversible",
    )
    assert view.diff == [
        DiffLine("del", '- accepted_versions: ["v1", "v2"]'),
        DiffLine("add", '+ accepted_versions: ["v2"]'),
    ]
    assert view.arguments == [("base_version", "3")]
    assert not view.cannot_be_undone


def test_it_diffs_before_and_after_and_reads_a_given_diff() -> None:
    view = describe_action(
        {"tool": "t", "target": "doc", "before": {"ttl": 1}, "after": {"ttl": 2}}
    )
    kinds = [line.kind for line in view.diff]
    assert kinds[:3] == ["meta", "meta", "hunk"] and "add" in kinds and "del" in kinds
    given = describe_action({"tool": "t", "diff": "--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n z"})
    assert [line.kind for line in given.diff] == ["meta", "meta", "hunk", "del", "add", "ctx"]


def test_it_keeps_what_it_does_not_know() -> None:
    view = describe_action(
        {
            "tool": "webhook",
            "target": "https://hooks.example.com",
            "reversibility": "irreversible",
            "arguments": {"subject": "Week 47"},
            "ticket": "SEC-1",
        }
    )
    assert view.title == "webhook on https://hooks.example.com"
    assert view.cannot_be_undone
    assert view.arguments == [("subject", "Week 47"), ("ticket", "SEC-1")]
    assert describe_action("just a string").arguments == []
    assert describe_action("just a string").title == "Run just a string"


def test_it_counts_down_in_compact_spans() -> None:
    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    assert span(42) == "42s" and span(185) == "3m 05s"
    assert span(2 * 3600 + 14 * 60 + 5) == "2h 14m" and span(3 * 86400 + 7200) == "3d 2h"
    assert expires_text(now + dt.timedelta(minutes=5), now) == "Expires in 5m 00s"
    assert expires_text(now - dt.timedelta(seconds=1), now) == "Expired"


def test_it_reads_short_lists_in_context_as_text_and_folds_long_values() -> None:
    items = {
        i.key: i
        for i in context_items(
            {
                "versions": ["v1", "v2"],
                "flat": {"a": list(range(9)), "b": True},
                "deep": {"a": [{"n": i} for i in range(9)]},
                "note": "x",
            }
        )
    }
    assert (items["versions"].text, items["versions"].structured) == ("v1, v2", False)
    # A flat object reads as a table (issue 15: JSON values as readable tables).
    assert items["flat"].rows == (("a", "0, 1, 2, 3, 4, 5, 6, 7, 8"), ("b", "yes"))
    assert items["deep"].structured and items["deep"].long
    assert not items["note"].structured and not items["note"].long


def test_every_event_type_has_its_sentence_in_one_table() -> None:
    from dashboard.present import SENTENCES
    from ledger.events import SideEffectEvent, outcome_event
    from ledger.models import SideEffectStatus
    from runs.events import EventType

    # The run store's events: one row each in the presenter's table.
    assert set(SENTENCES) == set(EventType)
    # The ledger's: every outcome status has its event, and every event its words.
    outcomes = set(SideEffectStatus.values) - {SideEffectStatus.PENDING}
    assert {outcome_event(s) for s in outcomes} <= set(SideEffectEvent)
    assert all(str(e.label) != e.value for e in SideEffectEvent)
