"""Typed inputs and answers: a Pydantic model or a dataclass in place of a JSON Schema.

``Agent(input_schema=Invoice)`` and ``ctx.ask(prompt, Tone)`` accept a type. Its JSON
Schema (``schema_of``) is what the run store stores and validates at every door (the API,
the dashboard's form, ``answerrun``), so a wrong answer is refused with JSON pointers
before it reaches the run. The step then receives the typed value (``parse``): an instance
of the model or the dataclass, built from the validated JSON.

A Pydantic model is recognised by its methods (``model_json_schema``, ``model_validate``),
so the runtime does not import Pydantic: an agent that uses it brings it. A dataclass
needs nothing; its fields may be ``str``, ``int``, ``float``, ``bool``, ``None``, lists,
dicts with string keys, ``Literal[...]``, an ``Enum``, ``X | None`` and other dataclasses;
``Annotated[str, {"format": "email"}]`` adds JSON Schema keywords (a ``description``,
bounds, a format). A field with a default is optional.

Nothing here imports Django or the run store.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

__all__ = ["TypedValueError", "dump", "is_typed", "parse", "schema_of"]


class TypedValueError(ValueError):
    """The JSON does not make a value of the type; ``errors`` are ``{pointer, message}``."""

    def __init__(self, message: str, errors: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.errors = errors


def _is_pydantic(tp: Any) -> bool:
    return isinstance(tp, type) and all(
        callable(getattr(tp, name, None)) for name in ("model_json_schema", "model_validate")
    )


def is_typed(tp: Any) -> bool:
    """Whether ``tp`` is a type this module turns into a schema (a model or a dataclass)."""
    return _is_pydantic(tp) or (isinstance(tp, type) and dataclasses.is_dataclass(tp))


def schema_of(tp: Any) -> dict[str, Any]:
    """The JSON Schema of a Pydantic model or a dataclass."""
    if _is_pydantic(tp):
        schema: dict[str, Any] = tp.model_json_schema()
        return schema
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_schema(tp)
    raise TypeError(f"{tp!r} is neither a Pydantic model nor a dataclass.")


def _dataclass_schema(tp: type) -> dict[str, Any]:
    hints = typing.get_type_hints(tp, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(tp):
        if not f.init:
            continue
        properties[f.name] = _type_schema(hints[f.name], where=f"{tp.__name__}.{f.name}")
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        if not has_default:
            required.append(f.name)
    schema: dict[str, Any] = {
        "type": "object",
        "title": tp.__name__,
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    if tp.__doc__ and not tp.__doc__.startswith(f"{tp.__name__}("):
        schema["description"] = tp.__doc__.strip()
    return schema


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(tp: Any, *, where: str) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        # Annotated[str, {"format": "date", "maxLength": 10}]: the dicts add to the schema.
        schema = _type_schema(args[0], where=where)
        for extra in args[1:]:
            if isinstance(extra, dict):
                schema.update(extra)
        return schema
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if tp is type(None) or tp is None:
        return {"type": "null"}
    if tp is Any:
        return {}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [member.value for member in tp]}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_schema(tp)
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple):
        item = args[0] if args else Any
        return {"type": "array", "items": _type_schema(item, where=where)}
    if origin is dict or tp is dict:
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": _type_schema(value, where=where)}
    if origin in (typing.Union, types.UnionType):
        options = [_type_schema(a, where=where) for a in args]
        return {"anyOf": options}
    raise TypeError(f"{where}: cannot make a JSON Schema of {tp!r}.")


def parse(tp: Any, value: Any) -> Any:
    """Build an instance of ``tp`` from JSON that its schema accepted.

    Raises ``TypedValueError`` (with pointers) when the type refuses it anyway (a Pydantic
    validator the schema cannot say, a value the dataclass cannot take).
    """
    if _is_pydantic(tp):
        try:
            return tp.model_validate(value)
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            raw = getattr(exc, "errors", None)
            errors = [
                {
                    "pointer": "/" + "/".join(str(part) for part in error.get("loc", ())),
                    "message": str(error.get("msg", "")),
                }
                for error in (raw() if callable(raw) else [])
            ] or [{"pointer": "/", "message": str(exc)}]
            raise TypedValueError(
                f"{tp.__name__}: " + "; ".join(f"{e['pointer']}: {e['message']}" for e in errors),
                errors,
            ) from None
    return _build(tp, value, "")


def _build(tp: Any, value: Any, pointer: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _build(args[0], value, pointer)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _wrong(pointer, f"expected an object for {tp.__name__}")
        hints = typing.get_type_hints(tp, include_extras=True)
        kwargs = {
            f.name: _build(hints[f.name], value[f.name], f"{pointer}/{f.name}")
            for f in dataclasses.fields(tp)
            if f.init and f.name in value
        }
        try:
            return tp(**kwargs)
        except (TypeError, ValueError) as exc:
            raise _wrong(pointer or "/", str(exc)) from None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise _wrong(pointer or "/", f"not one of {[m.value for m in tp]}") from None
    if origin in (list, tuple, set, frozenset) and isinstance(value, list):
        item = args[0] if args else Any
        built = [_build(item, v, f"{pointer}/{i}") for i, v in enumerate(value)]
        return built if origin is list else origin(built)
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return {k: _build(args[1], v, f"{pointer}/{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        for option in args:
            if option is type(None) and value is None:
                return None
        for option in args:
            if option is type(None):
                continue
            try:
                return _build(option, value, pointer)
            except TypedValueError:
                continue
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _wrong(pointer: str, message: str) -> TypedValueError:
    return TypedValueError(f"{pointer}: {message}", [{"pointer": pointer, "message": message}])


def dump(value: Any) -> Any:
    """A typed value as JSON (the inverse of ``parse``): what a person or a client sends."""
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):
        return model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple | set | frozenset):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): dump(v) for k, v in value.items()}
    return value
