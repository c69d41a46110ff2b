"""Issue 13, finding 10: names that end in a newline no longer pass, and an e-mail
header error is a refusal (``failed``), never an ``unknown`` outcome."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools import ActionFailed, get_tool
from ledger.tools.config_store import check_document_name
from runs.errors import HoldpointError
from runs.schemas import validate_value, validation_errors
from tests.ledger.conftest import config_dir, mailbox  # noqa: F401 - fixtures
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "name", ["staging/auth\n", "staging\n/auth", "app\n", "app\r\n", "app\x00", "app/"]
)
def test_a_config_document_name_with_a_line_break_is_refused(name: str) -> None:
    with pytest.raises(ActionFailed):
        check_document_name(name)
    check_document_name("staging/auth/config")


@pytest.mark.usefixtures("config_dir")
def test_the_config_store_refuses_it_before_anything_is_written() -> None:
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as refused:
        ledger.side_effect_begin(
            **epochs(lease),
            step_id="write",
            tool="config_store",
            target="app",
            request={"document": "app\n", "content": {"ttl": 1}},
        )
    assert refused.value.code == "invalid_input"
    assert not SideEffect.objects.exists()


SLUG = {"type": "string", "pattern": "^[a-z0-9-]+$"}


@pytest.mark.parametrize("value", ["auth\n", "auth-v2\n", "\nauth"])
def test_a_schema_pattern_matches_the_whole_text(value: str) -> None:
    schema = {"type": "object", "properties": {"slug": SLUG}}
    with pytest.raises(HoldpointError):
        validate_value(schema, {"slug": value})
    validate_value(schema, {"slug": "auth-v2"})


def test_pattern_properties_match_whole_names() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x$": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert validation_errors(schema, {"x": 1}) == []
    assert validation_errors(schema, {"x\n": 1}) != []


def test_a_dollar_that_is_escaped_or_in_a_class_stays_a_dollar() -> None:
    price = {"type": "string", "pattern": r"^\$[0-9]+[$]?$"}
    assert validation_errors(price, "$12") == []
    assert validation_errors(price, "$12$") == []
    assert validation_errors(price, "$12\n") != []


@pytest.mark.parametrize(
    "request_",
    [
        {"to": "ops@example.com", "subject": "Rotated\nBcc: everyone@corp.example"},
        {"to": "ops@example.com\nBcc: everyone@corp.example", "subject": "Rotated"},
        {"to": "ops@example.com", "subject": "Rotated", "from": "a@example.com\r\nX-A: 1"},
        {"to": "ops@example.com", "subject": "Rotated", "cc": ["x@example.com\n"]},
    ],
)
def test_an_email_header_error_is_a_refusal(request_: dict[str, Any], mailbox: Any) -> None:  # noqa: F811
    with pytest.raises(ActionFailed):
        get_tool("email").execute({**request_, "body": "b"}, "key-1")
    assert mailbox == []
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as refused:
        ledger.side_effect_begin(
            **epochs(lease), step_id="notify", tool="email", target="ops", request=request_
        )
    assert refused.value.code == "invalid_input"
    assert not SideEffect.objects.exists()
