"""Issue 19, point 4: typed inputs and answers (a dataclass or a Pydantic model) and
``ctx.choose``, through the real run store and worker (and the harness)."""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Annotated, Any, Literal

import pydantic
import pytest
from django.test import Client
from holdpoint_client.typed import TypedValueError, parse, schema_of

from runs import services
from runs.errors import HoldpointError
from runs.models import InputRequest
from runtime.executor import Outcome
from runtime.testing import run_agent
from tests.runtime.conftest import fresh, run_next


class Tone(enum.Enum):
    FRIENDLY = "friendly"
    FIRM = "firm"


@dataclasses.dataclass
class Address:
    city: str
    zip: str | None = None


@dataclasses.dataclass
class Invoice:
    """An invoice to chase."""

    number: Annotated[str, {"minLength": 3, "description": "Like INV-7"}]
    amount: float
    tone: Tone
    kind: Literal["first", "second"] = "first"
    tags: list[str] = dataclasses.field(default_factory=list)
    address: Address | None = None


class Decision(pydantic.BaseModel):
    keep: list[str] = pydantic.Field(min_length=1)
    grace_days: int = pydantic.Field(ge=0, le=30)

    @pydantic.field_validator("keep")
    @classmethod
    def no_v1(cls, value: list[str]) -> list[str]:
        if "v1" in value:
            raise ValueError("v1 is retired")
        return value


def test_a_dataclass_becomes_a_json_schema() -> None:
    schema = schema_of(Invoice)
    assert schema["required"] == ["number", "amount", "tone"]
    assert schema["additionalProperties"] is False
    assert schema["description"] == "An invoice to chase."
    props = schema["properties"]
    assert props["number"] == {"type": "string", "minLength": 3, "description": "Like INV-7"}
    assert props["amount"] == {"type": "number"}
    assert props["tone"] == {"enum": ["friendly", "firm"]}
    assert props["kind"] == {"enum": ["first", "second"]}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["address"]["anyOf"][1] == {"type": "null"}
    assert props["address"]["anyOf"][0]["required"] == ["city"]


def test_json_becomes_the_typed_value() -> None:
    value = parse(
        Invoice,
        {"number": "INV-7", "amount": 12, "tone": "firm", "address": {"city": "Lyon"}},
    )
    assert value == Invoice(
        number="INV-7", amount=12.0, tone=Tone.FIRM, address=Address(city="Lyon")
    )
    assert isinstance(value.amount, float)
    with pytest.raises(TypedValueError) as wrong:
        parse(Invoice, {"number": "INV-7", "amount": 1, "tone": "rude"})
    assert wrong.value.errors == [
        {"pointer": "/tone", "message": "not one of ['friendly', 'firm']"}
    ]


def test_a_pydantic_models_own_validator_keeps_its_pointer() -> None:
    assert schema_of(Decision)["properties"]["grace_days"]["maximum"] == 30
    with pytest.raises(TypedValueError) as wrong:
        parse(Decision, {"keep": ["v1"], "grace_days": 1})
    assert wrong.value.errors[0]["pointer"] == "/keep"
    assert "v1 is retired" in wrong.value.errors[0]["message"]


@pytest.mark.django_db
def test_a_typed_input_is_checked_at_the_door_and_the_step_gets_the_instance(
    make_agent: Any,
) -> None:
    agent = make_agent(input_schema=Invoice)
    seen: list[Any] = []

    @agent.step
    def only(ctx: Any, state: Any) -> Any:
        seen.append(ctx.input)
        return ctx.done({"number": ctx.input.number, "tone": ctx.input.tone.value})

    with pytest.raises(HoldpointError) as refused:
        services.run_start(agent=agent.name, input={"number": "IN", "amount": "x", "tone": "firm"})
    assert refused.value.code == "invalid_input"
    assert [e["pointer"] for e in refused.value.extra["errors"]] == ["/amount", "/number"]

    run = services.run_start(
        agent=agent.name, input={"number": "INV-7", "amount": 3.5, "tone": "friendly"}
    )
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"number": "INV-7", "tone": "friendly"}
    assert seen == [Invoice(number="INV-7", amount=3.5, tone=Tone.FRIENDLY)]


@pytest.mark.django_db
def test_a_typed_answer_is_checked_with_pointers_and_the_step_gets_the_model(
    make_agent: Any,
) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx: Any, state: Any) -> Any:
        decision = ctx.ask("Which versions?", Decision)
        assert isinstance(decision, Decision)
        return ctx.done({"keep": decision.keep, "grace": decision.grace_days})

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    request = fresh(run).pending_request
    assert request.accepted_schema["properties"]["grace_days"]["maximum"] == 30
    with pytest.raises(HoldpointError) as refused:
        services.run_resume(
            run_id=run.id,
            request_id=request.id,
            checkpoint_id=request.checkpoint_id,
            value={"keep": [], "grace_days": 99},
        )
    assert [e["pointer"] for e in refused.value.extra["errors"]] == ["/grace_days", "/keep"]
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value={"keep": ["v2"], "grace_days": 3},
    )
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"keep": ["v2"], "grace": 3}


@pytest.mark.django_db
def test_an_answer_the_models_validator_refuses_fails_the_step_deterministic_with_its_pointer(
    make_agent: Any,
) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx: Any, state: Any) -> Any:
        return ctx.done(ctx.ask("Which versions?", Decision).keep)

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    request = fresh(run).pending_request
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value={"keep": ["v1"], "grace_days": 3},
    )
    assert run_next(agent) == Outcome.FAILED
    failed = fresh(run)
    assert failed.status == "failed" and failed.failure_class == "deterministic"
    assert "/keep: " in failed.failure_detail and "v1 is retired" in failed.failure_detail


@pytest.mark.django_db
def test_choose_is_rendered_as_buttons_and_one_click_answers_it(
    make_agent: Any, client: Client, operator: Any
) -> None:
    agent = make_agent()

    @agent.step
    def pick(ctx: Any, state: Any) -> Any:
        tone = ctx.choose(
            "Which tone for Acme?",
            {"friendly": "Friendly", "firm": "Firm", "final": "Final notice"},
            expires_in=3600,
        )
        return ctx.done({"tone": tone})

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    request = fresh(run).pending_request
    assert request.step_id == "pick.choose"
    client.force_login(operator)
    page = client.get(f"/runs/{run.id}/").content.decode()
    card = page[page.index(f'id="request-{request.id}"') :]
    buttons = re.findall(
        r'<button type="submit" name="([^"]+)" value="([^"]+)" class="btn btn-primary btn-choice"',
        card,
    )
    labels = re.findall(r'class="btn btn-primary btn-choice"[^>]*><bdi>([^<]+)</bdi>', card)
    assert labels == ["Friendly", "Firm", "Final notice"]
    name, token = buttons[1]
    response = client.post(
        f"/runs/{run.id}/requests/{request.id}/answer",
        {
            "idempotency_key": "choose-1",
            "run_id": run.id,
            "request_id": request.id,
            "checkpoint_id": request.checkpoint_id,
            "origin": "run",
            name: token,
        },
    )
    assert response.status_code in (200, 302, 303)
    assert InputRequest.objects.get(pk=request.id).answer == {"choice": "firm"}
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"tone": "firm"}


def test_choose_refuses_options_it_cannot_show() -> None:
    from runtime.questions import choice_schema

    with pytest.raises(ValueError, match="different options"):
        choice_schema(["a", "a"])
    with pytest.raises(ValueError, match="1 to 200"):
        choice_schema(["", "b"])


def test_the_harness_speaks_typed_values_and_choices(make_agent: Any) -> None:
    agent = make_agent(input_schema=Invoice)

    @agent.step
    def only(ctx: Any, state: Any) -> Any:
        decision = ctx.ask("Which?", Decision)
        kind = ctx.choose("Reminder?", ["first", "second"])
        return ctx.done([ctx.input.number, decision.grace_days, kind])

    run = run_agent(
        agent,
        Invoice(number="INV-9", amount=1.0, tone=Tone.FIRM),
        answers=[Decision(keep=["v2"], grace_days=2), "second"],
    )
    assert run.status == "succeeded", run.error
    assert run.result == ["INV-9", 2, "second"]
    assert run.questions[1].answer == {"choice": "second"}
