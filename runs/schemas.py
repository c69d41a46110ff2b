"""JSON Schema handling for input requests and agent inputs.

``accepted_schema`` is JSON Schema. The compact form ``{"versions": "string[]"}``
(field name -> type word, ``[]`` for arrays, a trailing ``?`` for optional) is
accepted too and stored compiled, so everything downstream sees one format. A
required compact list (``string[]``) compiles with ``minItems: 1``.

**Required means not empty.** ``schema_problems`` is the one validator of answers
and inputs: the API, the dashboard's forms and ``answerrun`` all use it. Besides
JSON Schema itself, it refuses an empty string (only whitespace) or an empty list
for a property its object lists in ``required``, unless the property's own schema
allows it explicitly (``minLength: 0`` / ``minItems: 0``). ``format`` (email, date,
uri…) is checked too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from runs.errors import HoldpointError

_COMPACT_TYPES = {"string", "integer", "number", "boolean", "object"}
_SCHEMA_KEYWORDS = {
    "type",
    "properties",
    "$schema",
    "enum",
    "const",
    "oneOf",
    "anyOf",
    "allOf",
    "items",
    "required",
    "$ref",
    "not",
}
# Nesting deeper than this is refused: it only ever comes from a bug or an attack.
MAX_DEPTH = 32
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {"type": "string", "enum": ["approve", "deny"]},
        "comment": {"type": "string", "maxLength": 2000},
    },
    "required": ["decision"],
    "additionalProperties": False,
}


def _is_compact(schema: dict[str, Any]) -> bool:
    return (
        bool(schema)
        and not (_SCHEMA_KEYWORDS & schema.keys())
        and all(isinstance(v, str) for v in schema.values())
    )


def _compile_compact_field(name: str, word: str) -> tuple[dict[str, Any], bool]:
    optional = word.endswith("?")
    word = word.rstrip("?")
    is_array = word.endswith("[]")
    base = word[:-2] if is_array else word
    if base not in _COMPACT_TYPES:
        raise HoldpointError(
            "invalid_input",
            f"Compact schema field {name!r} has type {word!r}; use one of "
            f"{', '.join(sorted(_COMPACT_TYPES))}, optionally with [] or ?.",
            pointer=f"/{name}",
        )
    field: dict[str, Any] = {"type": base}
    if is_array:
        field = {"type": "array", "items": {"type": base}}
        if not optional:
            # Required means at least one item: an empty list is no answer (docs/agents.md).
            field["minItems"] = 1
    return field, not optional


def compile_schema(schema: Any) -> dict[str, Any]:
    """Return a checked JSON Schema (draft 2020-12) for ``schema`` or raise ``invalid_input``."""
    if not isinstance(schema, dict):
        raise HoldpointError("invalid_input", "accepted_schema must be a JSON object.")
    if depth(schema) > MAX_DEPTH:
        raise HoldpointError("invalid_input", f"The schema nests deeper than {MAX_DEPTH} levels.")
    if _is_compact(schema):
        properties: dict[str, Any] = {}
        required: list[str] = []
        for name, word in schema.items():
            properties[name], is_required = _compile_compact_field(name, word)
            if is_required:
                required.append(name)
        compiled: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
    else:
        compiled = schema
    try:
        Draft202012Validator.check_schema(compiled)
    except SchemaError as exc:
        raise HoldpointError(
            "invalid_input", f"accepted_schema is not valid JSON Schema: {exc.message}"
        ) from None
    return compiled


@dataclass(frozen=True)
class SchemaProblem:
    """One way a value breaks its schema: where (a JSON pointer, "" for the root), which
    rule (a JSON Schema keyword, or ``required`` for a missing or empty required value),
    the rule's bound, the schema of the value, and jsonschema's own English message."""

    pointer: str
    kind: str
    bound: Any
    schema: dict[str, Any]
    message: str


def _escape(part: Any) -> str:
    return str(part).replace("~", "~0").replace("/", "~1")


def _is_empty(value: Any, schema: Any) -> bool:
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(value, str) and not value.strip():
        return schema.get("minLength") != 0
    if isinstance(value, list) and not value:
        return schema.get("minItems") != 0
    return False


def _empty_required(schema: Any, value: Any, pointer: str) -> list[SchemaProblem]:
    """Required properties given as "" or [] (anywhere in ``value``, where the schema says)."""
    if not isinstance(schema, dict):
        return []
    found: list[SchemaProblem] = []
    properties = schema.get("properties")
    if isinstance(value, dict) and isinstance(properties, dict):
        listed = schema.get("required")
        required: list[Any] = listed if isinstance(listed, list) else []
        for key, sub in properties.items():
            if key not in value:
                continue
            here = f"{pointer}/{_escape(key)}"
            if key in required and _is_empty(value[key], sub):
                found.append(
                    SchemaProblem(
                        here, "required", key, sub if isinstance(sub, dict) else {}, "empty"
                    )
                )
            else:
                found += _empty_required(sub, value[key], here)
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        for index, item in enumerate(value):
            found += _empty_required(items, item, f"{pointer}/{index}")
    return found


def _problem(error: ValidationError) -> SchemaProblem:
    pointer = "".join(f"/{_escape(part)}" for part in error.absolute_path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "required" and isinstance(error.instance, dict):
        # "'name' is a required property": the problem belongs to the missing field.
        missing = [
            key
            for key in (error.validator_value or [])
            if isinstance(key, str) and key not in error.instance
        ]
        if missing:
            pointer = f"{pointer}/{_escape(missing[0])}"
            found = schema.get("properties", {}).get(missing[0])
            schema = found if isinstance(found, dict) else {}
    return SchemaProblem(
        pointer, str(error.validator), error.validator_value, schema, str(error.message)
    )


def schema_problems(schema: dict[str, Any], value: Any) -> list[SchemaProblem]:
    """Every way ``value`` breaks ``schema``, sorted by pointer: the one validator."""
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    empty = {p.pointer: p for p in _empty_required(schema, value, "")}
    problems = [
        p
        for p in (_problem(error) for error in validator.iter_errors(value))
        # An empty required value is said once, as "required", not as "at least 1 item".
        if not (p.pointer in empty and p.kind in ("minItems", "minLength"))
    ]
    seen = {p.pointer for p in problems}
    problems += [p for pointer, p in empty.items() if pointer not in seen]
    return sorted(problems, key=lambda p: p.pointer)


def _api_message(problem: SchemaProblem) -> str:
    if problem.kind == "required" and problem.message == "empty":
        return "This field is required and may not be empty."
    return problem.message


def validation_errors(schema: dict[str, Any], value: Any) -> list[dict[str, str]]:
    """Every way ``value`` breaks ``schema``, as ``{pointer, message}``, sorted by pointer."""
    return [
        {"pointer": p.pointer or "/", "message": _api_message(p)}
        for p in schema_problems(schema, value)
    ]


def validate_value(schema: dict[str, Any], value: Any, *, what: str = "value") -> None:
    errors = validation_errors(schema, value)
    if errors:
        raise HoldpointError(
            "invalid_input", f"The {what} does not match the schema.", errors=errors
        )


def depth(value: Any, _level: int = 0) -> int:
    """Nesting depth of a JSON value, stopping early past MAX_DEPTH."""
    if _level > MAX_DEPTH:
        return _level
    if isinstance(value, dict):
        return max((depth(v, _level + 1) for v in value.values()), default=_level + 1)
    if isinstance(value, list):
        return max((depth(v, _level + 1) for v in value), default=_level + 1)
    return _level


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
