"""Forms generated from JSON Schema: what each schema becomes, what a submission parses to,
and where the errors land. Pure: no database."""

from __future__ import annotations

from typing import Any

from django.http import QueryDict

from dashboard.schema_forms import SchemaForm
from runs.schemas import compile_schema, validation_errors


def post(pairs: list[tuple[str, str]]) -> QueryDict:
    data = QueryDict(mutable=True)
    for key, value in pairs:
        data.appendlist(key, value)
    return data


def by_name(form: SchemaForm) -> dict[str, Any]:
    found = {}

    def walk(fields: list[Any]) -> None:
        for f in fields:
            found[f.name] = f
            walk(f.children)

    walk(form.fields())
    return found


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {
            "type": "string",
            "title": "Title",
            "description": "Shown to users",
            "maxLength": 20,
        },
        "count": {"type": "integer", "minimum": 1, "maximum": 5, "default": 2},
        "ratio": {"type": "number"},
        "enabled": {"type": "boolean"},
        "color": {"type": "string", "enum": ["red", "green", "blue", "cyan"]},
        "size": {"type": "string", "enum": ["s", "m", "l", "xl", "xxl", "3xl", "4xl"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "regions": {"type": "array", "items": {"type": "string", "enum": ["eu", "us", "ap"]}},
        "owner": {
            "type": "object",
            "title": "Owner",
            "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name"],
        },
        "extra": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    },
    "required": ["title", "count", "tags"],
    "additionalProperties": False,
}


def test_it_renders_each_kind_of_schema_as_the_right_input() -> None:
    fields = by_name(SchemaForm(SCHEMA, prefix="t"))
    assert fields["answer/title"].widget == "text"
    assert fields["answer/title"].label == "Title"
    assert fields["answer/title"].help == "Shown to users"
    assert fields["answer/title"].required is True
    assert fields["answer/title"].attrs["maxlength"] == "20"
    assert fields["answer/count"].widget == "number"
    assert fields["answer/count"].attrs == {
        "step": "1",
        "min": "1",
        "max": "5",
        "inputmode": "numeric",
    }
    assert fields["answer/count"].shown == "2"  # the default is pre-filled
    assert fields["answer/ratio"].attrs["step"] == "any"
    assert fields["answer/enabled"].widget == "checkbox"
    assert fields["answer/color"].widget == "radio"
    assert fields["answer/size"].widget == "select"
    assert fields["answer/tags"].widget == "list"
    assert fields["answer/regions"].widget == "checkboxes"
    assert fields["answer/owner"].widget == "fieldset"
    assert fields["answer/owner/name"].required is True
    assert fields["answer/owner/email"].required is False
    assert fields["answer/extra"].widget == "json"


def test_it_puts_required_fields_first_because_jsonb_loses_key_order() -> None:
    names = [f.key for f in SchemaForm(SCHEMA).fields()]
    assert names[:3] == ["title", "count", "tags"]


def test_it_parses_a_full_submission_into_the_json_the_schema_accepts() -> None:
    form = SchemaForm(
        SCHEMA,
        post(
            [
                ("answer/title", "  Hello  "),
                ("answer/count", "3"),
                ("answer/ratio", "0.25"),
                ("answer/enabled", "true"),
                ("answer/color", "2"),
                ("answer/size", "6"),
                ("answer/tags", "a"),
                ("answer/tags", ""),
                ("answer/tags", "b"),
                ("answer/regions", "2"),
                ("answer/regions", "0"),
                ("answer/owner/name", "Ann"),
                ("answer/extra", "7"),
            ]
        ),
    )
    assert form.is_valid(), (form.errors, [f.errors for f in by_name(form).values()])
    assert form.value == {
        "title": "Hello",
        "count": 3,
        "ratio": 0.25,
        "enabled": True,
        "color": "blue",
        "size": "4xl",
        "tags": ["a", "b"],
        "regions": ["eu", "ap"],  # in the order of the options
        "owner": {"name": "Ann"},
        "extra": 7,
    }
    assert validation_errors(SCHEMA, form.value) == []


def test_it_leaves_out_empty_optional_fields_and_a_wholly_empty_optional_object() -> None:
    form = SchemaForm(
        SCHEMA, post([("answer/title", "x"), ("answer/count", "1"), ("answer/tags", "t")])
    )
    assert form.is_valid()
    assert form.value == {"title": "x", "count": 1, "tags": ["t"], "enabled": False}


def test_it_puts_each_error_next_to_its_field_and_keeps_the_values() -> None:
    form = SchemaForm(
        SCHEMA,
        post(
            [
                ("answer/title", "x" * 21),
                ("answer/count", "9"),
                ("answer/ratio", "abc"),
                ("answer/owner/email", "a@b"),
                ("answer/tags", ""),
            ]
        ),
    )
    assert not form.is_valid()
    fields = by_name(form)
    assert fields["answer/ratio"].errors == ["Enter a number."]
    assert fields["answer/ratio"].shown == "abc"
    # A parse error stops before schema validation; fix it and the schema speaks.
    form = SchemaForm(
        SCHEMA,
        post(
            [
                ("answer/title", "x" * 21),
                ("answer/count", "9"),
                ("answer/owner/email", "a@b"),
                ("answer/tags", ""),
            ]
        ),
    )
    assert not form.is_valid()
    fields = by_name(form)
    assert fields["answer/title"].errors == ["Must be at most 20 characters."]
    assert fields["answer/title"].shown == "x" * 21
    assert fields["answer/count"].errors == ["Must be at most 5."]
    assert fields["answer/count"].shown == "9"
    assert fields["answer/tags"].errors == ["This field is required."]
    assert fields["answer/owner/name"].errors == ["This field is required."]
    assert fields["answer/owner/email"].shown == "a@b"
    assert form.errors == []


def test_it_refuses_a_fraction_for_an_integer_and_an_unknown_option() -> None:
    form = SchemaForm(
        SCHEMA,
        post(
            [
                ("answer/title", "x"),
                ("answer/count", "1.5"),
                ("answer/tags", "t"),
                ("answer/color", "99"),
            ]
        ),
    )
    assert not form.is_valid()
    fields = by_name(form)
    assert fields["answer/count"].errors == ["Enter a whole number."]
    assert fields["answer/color"].errors == ["Choose one of the options."]


def test_it_answers_a_lone_small_choice_with_one_button_per_option() -> None:
    schema = {
        "type": "object",
        "properties": {"go": {"type": "string", "enum": ["yes", "no", "later"]}},
        "required": ["go"],
    }
    form = SchemaForm(schema)
    assert [c.label for c in form.buttons] == ["yes", "no", "later"]
    assert form.button_field is not None and form.button_field.name == "answer/go"
    bound = SchemaForm(schema, post([("answer/go", "1")]))
    assert bound.is_valid() and bound.value == {"go": "no"}
    # Four options, or an optional choice, get radios and a Submit button instead.
    schema["properties"]["go"]["enum"].append("never")
    assert SchemaForm(schema).buttons == []


def test_it_labels_oneof_consts_with_their_titles() -> None:
    schema = {
        "type": "object",
        "properties": {
            "plan": {
                "oneOf": [{"const": "a", "title": "Plan A"}, {"const": "b", "title": "Plan B"}]
            }
        },
    }
    fields = by_name(SchemaForm(schema))
    assert [c.label for c in fields["answer/plan"].choices] == ["Plan A", "Plan B"]
    bound = SchemaForm(schema, post([("answer/plan", "1")]))
    assert bound.is_valid() and bound.value == {"plan": "b"}


def test_it_handles_the_compact_schema_form_once_compiled() -> None:
    schema = compile_schema({"versions": "string[]", "note": "string?"})
    form = SchemaForm(schema, post([("answer/versions", "v1"), ("answer/versions", "v2")]))
    assert form.is_valid()
    assert form.value == {"versions": ["v1", "v2"]}
    empty = SchemaForm(schema, post([]))
    assert not empty.is_valid()  # required means at least one item (runs.schemas)
    assert by_name(empty)["answer/versions"].errors == ["This field is required."]


def test_it_refuses_an_empty_required_value_of_a_full_schema_too() -> None:
    schema = {
        "type": "object",
        "properties": {
            "versions": {"type": "array", "items": {"type": "string"}},
            "why": {"type": "string"},
            "maybe": {"type": "array", "items": {"type": "string"}, "minItems": 0},
        },
        "required": ["versions", "why", "maybe"],
    }
    form = SchemaForm(schema, post([("answer/why", "  ")]))
    assert not form.is_valid()
    assert by_name(form)["answer/versions"].errors == ["This field is required."]
    assert by_name(form)["answer/why"].errors == ["This field is required."]
    assert by_name(form)["answer/maybe"].errors == []  # its own minItems: 0 allows it


def test_it_takes_one_value_per_line_from_the_textarea_shown_without_javascript() -> None:
    schema = compile_schema({"versions": "string[]"})
    form = SchemaForm(schema, post([("answer/versions", "v2\r\n v3 \n\n")]))
    assert form.is_valid() and form.value == {"versions": ["v2", "v3"]}


def test_it_says_what_a_pattern_wants_in_words_never_the_expression() -> None:
    schema = {
        "type": "object",
        "properties": {
            "notify": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+$", "format": "email"},
            "ticket": {
                "type": "string",
                "pattern": "^[A-Z]+-[0-9]+$",
                "description": "A ticket like OPS-12",
            },
        },
    }
    form = SchemaForm(schema, post([("answer/notify", "nobody"), ("answer/ticket", "x")]))
    assert not form.is_valid()
    assert by_name(form)["answer/notify"].errors == ["Must be an e-mail address."]
    assert by_name(form)["answer/ticket"].errors == ["Must be: A ticket like OPS-12."]


def test_it_asks_for_a_non_object_answer_as_one_field() -> None:
    form = SchemaForm({"type": "integer", "minimum": 0}, post([("answer", "-1")]))
    assert not form.is_valid()
    assert form.root.errors == ["Must be at least 0."]
    form = SchemaForm({"type": "integer", "minimum": 0}, post([("answer", "4")]))
    assert form.is_valid() and form.value == 4


def test_it_parses_json_for_what_it_cannot_render_and_says_when_json_is_bad() -> None:
    schema = {
        "type": "object",
        "properties": {"raw": {"type": "array", "items": {"type": "object"}}},
    }
    form = SchemaForm(schema, post([("answer/raw", "[{")]))
    assert not form.is_valid()
    assert by_name(form)["answer/raw"].errors[0].startswith("Enter valid JSON")
    form = SchemaForm(schema, post([("answer/raw", '[{"a": 1}]')]))
    assert form.is_valid() and form.value == {"raw": [{"a": 1}]}


def test_it_maps_service_errors_to_fields_by_pointer() -> None:
    form = SchemaForm(SCHEMA, post([]))
    form.add_errors(
        [
            {"pointer": "/owner/name", "message": "taken"},
            {"pointer": "/tags/3", "message": "bad item"},
            {"pointer": "/", "message": "whole thing"},
        ]
    )
    fields = by_name(form)
    assert fields["answer/owner/name"].errors == ["taken"]
    assert fields["answer/tags"].errors == ["bad item"]
    assert form.errors == ["whole thing"]


def test_it_escapes_slashes_in_property_names_in_pointers_and_names() -> None:
    schema = {"type": "object", "properties": {"a/b": {"type": "string"}}, "required": ["a/b"]}
    form = SchemaForm(schema, post([]))
    assert not form.is_valid()
    field = form.fields()[0]
    assert field.name == "answer/a~1b"
    assert field.errors == ["This field is required."]
    form = SchemaForm(schema, post([("answer/a~1b", "v")]))
    assert form.is_valid() and form.value == {"a/b": "v"}


# --- Values an agent names: an enum array, a pattern (issue 24, point 5) ---------------------

VERSIONS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "accepted_versions": {
            "type": "array",
            "items": {"type": "string", "enum": ["v1", "v2", "v3"]},
            "uniqueItems": True,
            "minItems": 1,
        }
    },
    "required": ["accepted_versions"],
    "additionalProperties": False,
}


def test_it_renders_an_enum_array_as_checkboxes_with_the_plan_ticked() -> None:
    form = SchemaForm(VERSIONS, initial={"accepted_versions": ["v2", "v3"]})
    [field] = form.fields()
    assert (field.widget, field.required) == ("checkboxes", True)
    assert [c.label for c in field.choices] == ["v1", "v2", "v3"]
    assert field.shown == {"1", "2"}
    form = SchemaForm(
        VERSIONS, post([("answer/accepted_versions", "2"), ("answer/accepted_versions", "0")])
    )
    assert form.is_valid() and form.value == {"accepted_versions": ["v1", "v3"]}


def test_it_refuses_a_value_outside_the_enum_and_keeps_the_choices() -> None:
    # A browser sends the options' tokens; a crafted or stale form may send anything.
    for sent in (["0", "7"], ["0", "v9"]):
        form = SchemaForm(VERSIONS, post([("answer/accepted_versions", t) for t in sent]))
        assert not form.is_valid()
        [field] = form.fields()
        assert field.errors == ["Choose among the options."]
        assert "0" in field.shown  # v1 stays ticked


def test_it_refuses_an_empty_enum_array_because_required_means_not_empty() -> None:
    form = SchemaForm(VERSIONS, post([]))
    assert not form.is_valid()
    assert form.fields()[0].errors == ["This field is required."]


def test_it_names_the_list_value_a_pattern_or_an_enum_refuses_and_keeps_the_values() -> None:
    schema = compile_schema(
        {
            "type": "object",
            "properties": {
                "versions": {
                    "type": "array",
                    "items": {
                        "type": "string",
                        "pattern": "^v[0-9]+$",
                        "description": "a version like v2",
                    },
                    "uniqueItems": True,
                }
            },
            "required": ["versions"],
        }
    )
    form = SchemaForm(schema, post([("answer/versions", "v1"), ("answer/versions", "x9")]))
    assert not form.is_valid()
    [field] = form.fields()
    assert field.errors == ["“x9”: Must be: a version like v2."]
    assert field.shown[:2] == ["v1", "x9"]
    form = SchemaForm(schema, post([("answer/versions", "v1\nv1")]))
    assert not form.is_valid()
    assert form.fields()[0].errors == ["Each item must be different."]
    # The service's own refusal of one value (an enum it checks, a stale form) names it too.
    form = SchemaForm(
        VERSIONS, post([("answer/accepted_versions", "0"), ("answer/accepted_versions", "2")])
    )
    assert form.is_valid()
    form.add_errors([{"pointer": "/accepted_versions/1", "message": "not an option any more"}])
    assert form.fields()[0].errors == ["“v3”: not an option any more"]
