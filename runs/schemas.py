"""JSON Schema handling for input requests and agent inputs.

``accepted_schema`` is JSON Schema. The compact form ``{"versions": "string[]"}``
(field name -> type word, ``[]`` for arrays, a trailing ``?`` for optional) is
accepted too and stored compiled, so everything downstream sees one format.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

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
# JSON nested deeper than this is refused, whether a request body (api/problems.py), a
# schema or a value the services store: it only ever comes from a bug or an attack.
MAX_JSON_DEPTH = 32
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
    return field, not optional


def compile_schema(schema: Any) -> dict[str, Any]:
    """Return a checked JSON Schema (draft 2020-12) for ``schema`` or raise ``invalid_input``."""
    if not isinstance(schema, dict):
        raise HoldpointError("invalid_input", "accepted_schema must be a JSON object.")
    if too_deep(schema):
        raise HoldpointError(
            "invalid_input", f"The schema nests deeper than {MAX_JSON_DEPTH} levels."
        )
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


def validation_errors(schema: dict[str, Any], value: Any) -> list[dict[str, str]]:
    """Every way ``value`` breaks ``schema``, as ``{pointer, message}``, sorted by pointer."""
    validator = Draft202012Validator(schema)
    errors = []
    for error in validator.iter_errors(value):
        pointer = "".join(f"/{part}" for part in error.absolute_path)
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = error.message.split("'")[1] if "'" in error.message else ""
            pointer = f"{pointer}/{missing}" if missing else pointer
        errors.append({"pointer": pointer or "/", "message": error.message})
    return sorted(errors, key=lambda e: e["pointer"])


def validate_value(schema: dict[str, Any], value: Any, *, what: str = "value") -> None:
    errors = validation_errors(schema, value)
    if errors:
        raise HoldpointError(
            "invalid_input", f"The {what} does not match the schema.", errors=errors
        )


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests containers deeper than ``limit`` (``{}`` is one level).
    Iterative, so a hostile value cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level + 1 > limit:
            return True
        stack.extend((child, level + 1) for child in children)
    return False


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
