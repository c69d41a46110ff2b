"""The gateway's settings file and its rule arithmetic, without a server: bad settings
are refused with a message that names the setting; a call's rule is the first matching
pattern's, else the tool's, and anything unknown asks for approval."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mcp")

from holdpoint_client.mcp_gateway.config import ConfigError, parse
from holdpoint_client.mcp_gateway.gateway import call_key
from holdpoint_client.mcp_gateway.rules import RuleBook, rule_for

TOKENS = {"HOLDPOINT_WORKER_TOKEN": "hpw_x", "HOLDPOINT_API_TOKEN": "t"}
GOOD: dict[str, Any] = {"agent": "gw", "servers": {"files": {"url": "http://127.0.0.1:1/mcp"}}}


def test_good_settings_parse() -> None:
    config = parse({**GOOD, "wait_seconds": 5, "servers": {"files": {"command": ["x"]}}}, TOKENS)
    assert config.agent == "gw" and config.wait_seconds == 5.0
    assert config.by_name["files"].command == ("x",)


@pytest.mark.parametrize(
    ("raw", "env", "names"),
    [
        ({"servers": GOOD["servers"]}, TOKENS, "agent"),
        ({"agent": "gw"}, TOKENS, "servers"),
        ({"agent": "gw", "servers": {"Bad Name": {"url": "u"}}}, TOKENS, "servers.Bad Name"),
        ({"agent": "gw", "servers": {"f": {"url": "u", "command": ["x"]}}}, TOKENS, "servers.f"),
        ({"agent": "gw", "servers": {"f": {}}}, TOKENS, "servers.f"),
        ({"agent": "gw", "servers": {"f": {"command": "x"}}}, TOKENS, "servers.f.command"),
        (GOOD, {}, "HOLDPOINT_WORKER_TOKEN"),
        ({**GOOD, "wait_seconds": -1}, TOKENS, "wait_seconds"),
        ({**GOOD, "wait_seconds": "soon"}, TOKENS, "wait_seconds"),
        ({**GOOD, "max_sessions": 0}, TOKENS, "max_sessions"),
        ({**GOOD, "agent": "x" * 101}, TOKENS, "agent"),
    ],
)
def test_bad_settings_are_refused_by_name(
    raw: dict[str, Any], env: dict[str, str], names: str
) -> None:
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        parse(raw, env)


ENTRY = {
    "rule": "record",
    "patterns": [
        {"argument": "path", "matches": "/etc/*", "rule": "approve"},
        {"argument": "path", "matches": "*.md", "rule": "pass"},
        {"argument": "size", "matches": "1?", "rule": "approve"},
    ],
}


@pytest.mark.parametrize(
    ("arguments", "rule"),
    [
        ({"path": "/etc/passwd"}, "approve"),
        ({"path": "README.md"}, "pass"),
        ({"path": "/etc/notes.md"}, "approve"),  # the first pattern that matches decides
        ({"path": "data.csv"}, "record"),
        ({"size": 12}, "approve"),  # a number is matched as its JSON text
        ({"size": 120}, "record"),
        ({}, "record"),
    ],
)
def test_the_first_matching_pattern_decides_else_the_tools_rule(
    arguments: dict[str, Any], rule: str
) -> None:
    assert rule_for(ENTRY, arguments) == rule


def test_unknown_tools_and_unreadable_rules_ask() -> None:
    assert rule_for(None, {}) == "approve"
    assert rule_for({"rule": "allow"}, {}) == "approve"
    assert (
        rule_for(
            {"rule": "pass", "patterns": [{"argument": "a", "matches": "*", "rule": "?"}]}, {"a": 1}
        )
        == "approve"
    )


def test_the_rule_book_keeps_its_rules_when_the_server_cannot_answer() -> None:
    answers = [[{"server": "files", "name": "read_file", "rule": "pass", "patterns": []}]]

    def fetch() -> list[dict[str, Any]]:
        if not answers:
            raise ConnectionError("away")
        return answers.pop()

    book = RuleBook(fetch, ttl=0)
    assert book.rule("files", "read_file", {}) == "pass"
    assert book.rule("files", "read_file", {}) == "pass"  # the server is away: kept
    assert book.rule("files", "write_file", {}) == "approve"


def test_the_same_call_is_the_same_key_and_a_client_key_makes_another() -> None:
    one = call_key("files", "write_file", {"path": "a", "text": "b"})
    assert one == call_key("files", "write_file", {"text": "b", "path": "a"})
    assert one != call_key("files", "write_file", {"path": "a", "text": "c"})
    assert one != call_key("files", "write_file", {"path": "a", "text": "b"}, "again")
