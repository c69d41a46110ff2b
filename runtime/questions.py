"""What a step asks, in shapes the runtime checks: the answer schema of ``ctx.choose``, the
``approval=`` of ``ctx.side_effect``, and typed values (``runtime/typed.py``) handed to a
step. Used by ``runtime/context.py`` and the harness (``runtime/testing``) alike.
"""

from __future__ import annotations

from typing import Any

from runtime.typed import TypedValueError, parse
from runtime.types import Deterministic

MAX_CHOICES = 50


def choice_schema(options: Any) -> dict[str, Any]:
    """The answer schema of ``ctx.choose``: ``{"choice": one of the options}``."""
    if isinstance(options, dict):
        pairs = [(value, str(label)) for value, label in options.items()]
    elif isinstance(options, list | tuple):
        pairs = [(value, str(value)) for value in options]
    else:
        raise TypeError("options must be a list of values or a dict of value to label.")
    values = [value for value, _ in pairs]
    if not 1 <= len(values) <= MAX_CHOICES or len(set(values)) != len(values):
        raise ValueError(f"choose takes 1 to {MAX_CHOICES} different options.")
    if not all(isinstance(v, str) and 0 < len(v) <= 200 for v in values):
        raise ValueError("Each option is a string of 1 to 200 characters.")
    return {
        "type": "object",
        "properties": {
            "choice": {"oneOf": [{"const": value, "title": label[:200]} for value, label in pairs]}
        },
        "required": ["choice"],
        "additionalProperties": False,
    }


APPROVAL_OPTIONS = ("prompt", "expires_in", "context")


def approval_options(approval: Any) -> dict[str, Any]:
    """Check ``ctx.side_effect(…, approval=…)``: the question an irreversible call asks."""
    if approval is None:
        return {}
    if not isinstance(approval, dict):
        raise TypeError('approval is a dict: {"prompt", "expires_in", "context"}.')
    unknown = set(approval) - set(APPROVAL_OPTIONS)
    if unknown:
        raise TypeError(
            f"approval takes {', '.join(APPROVAL_OPTIONS)}; not {', '.join(sorted(unknown))}."
        )
    prompt = approval.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise TypeError("approval prompt is a non-empty string.")
    context = approval.get("context")
    if context is not None and not isinstance(context, dict):
        raise TypeError("approval context is a dict.")
    return dict(approval)


def typed_value(tp: type | None, value: Any, what: str) -> Any:
    """``value`` as an instance of ``tp`` (a Pydantic model or a dataclass), or as it is.

    The JSON Schema of ``tp`` already accepted it at the door; a type that still refuses
    it (a validator the schema cannot say) fails the step, deterministic, with pointers.
    """
    if tp is None:
        return value
    try:
        return parse(tp, value)
    except TypedValueError as exc:
        raise Deterministic(f"The {what} does not make a {tp.__name__}: {exc}") from None
