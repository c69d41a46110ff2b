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

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import re2
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.validators import extend

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
        "decision": {"type": "string", "enum": ["approve", "deny", "respond"]},
        "comment": {"type": "string", "maxLength": 2000},
        # The approver's edit of the planned arguments (runs/approvals.py checks it against
        # the request's own editable schema).
        "edited": {},
    },
    "required": ["decision"],
    "additionalProperties": False,
}


class UnsupportedPattern(ValueError):
    """A pattern RE2 cannot run (look-around, back-references): refused where a schema is
    given, and never a match where an old stored schema still has one."""


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is our answer, not noise on stderr


@functools.lru_cache(maxsize=512)
def _anchored_at_end(pattern: str) -> Any:
    """``pattern`` compiled by RE2, which matches in time linear in the text.

    Patterns in schemas come from agents and their authors, and Python's backtracking
    engine takes exponential time on some (``^(a+)+$`` against ``"a" * 30 + "!"``): RE2
    has no such pattern, so no input, answer, edit or tool request can pin a web process.
    RE2's ``$`` is JSON Schema's (ECMA-262's): the end of the text, never before a trailing
    newline, as Python's is.
    """
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        raise UnsupportedPattern(
            f"{pattern!r} is not a pattern this server runs ({_re2_reason(exc)}); patterns use "
            "RE2 syntax: no look-around, no back-references"
        ) from None


def _re2_reason(exc: Exception) -> str:
    reason = exc.args[0] if exc.args else str(exc)
    return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)


_VALUE_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def pattern_problems(schema: Any, pointer: str = "") -> list[dict[str, str]]:
    """Every ``pattern`` and ``patternProperties`` key of ``schema`` that RE2 cannot run,
    as ``{pointer, message}`` (a pointer into the schema)."""
    found: list[dict[str, str]] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            here = f"{pointer}/{_escape(key)}"
            if key in _VALUE_KEYWORDS:
                continue  # values, not schemas: a "pattern" key there is data
            if key == "pattern" and isinstance(value, str):
                try:
                    _anchored_at_end(value)
                except UnsupportedPattern as exc:
                    found.append({"pointer": here, "message": str(exc)})
            elif key == "patternProperties" and isinstance(value, dict):
                for name, sub in value.items():
                    try:
                        _anchored_at_end(name)
                    except UnsupportedPattern as exc:
                        found.append({"pointer": f"{here}/{_escape(name)}", "message": str(exc)})
                    found += pattern_problems(sub, f"{here}/{_escape(name)}")
            else:
                found += pattern_problems(value, here)
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            found += pattern_problems(item, f"{pointer}/{index}")
    return found


def _search(pattern: str, text: str) -> bool:
    try:
        return _anchored_at_end(pattern).search(text) is not None
    except UnsupportedPattern:
        return False


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = sorted(
        key
        for key in instance
        if key not in properties and not any(_search(p, key) for p in patterns)
    )
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        yield ValidationError(
            f"Additional properties are not allowed ({', '.join(map(repr, extras))} "
            f"{'was' if len(extras) == 1 else 'were'} unexpected)"
        )


# Draft 2020-12 with ``pattern``, ``patternProperties`` and ``additionalProperties``
# matched as JSON Schema means them (see ``_anchored_at_end``). Every validation of
# agent-given schemas uses it.
SchemaValidator = extend(
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)


def schema_validator(schema: dict[str, Any]) -> Any:
    """The validator for a checked schema (``compile_schema``)."""
    return SchemaValidator(schema)


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
    unsupported = pattern_problems(compiled)
    if unsupported:
        raise HoldpointError(
            "invalid_input",
            f"The schema has a pattern this server does not run: {unsupported[0]['message']}.",
            errors=unsupported,
        )
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
    # Whole-string patterns (SchemaValidator) and formats (e-mail, date, …) enforced.
    validator = SchemaValidator(schema, format_checker=SchemaValidator.FORMAT_CHECKER)
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
