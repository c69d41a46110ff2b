"""HTML forms generated from a JSON Schema: the answer to an input request, an agent's input.

``SchemaForm(schema, data=None, prefix=...)`` turns the schema into a tree of
``SchemaField`` (one per input the person sees), parses a submitted ``QueryDict``
back into a JSON value, and validates that value against the same schema with the
same validator the services use, so an answer the form accepts is one
``run_resume`` accepts. Errors are put next to the field their JSON pointer names.

What becomes what:

==========================================  ===========================================
schema                                      input
==========================================  ===========================================
string (``format`` date / email / uri)      text (date / email / url); textarea when
                                            ``maxLength`` > 200
integer / number with bounds                number with ``min`` / ``max`` / ``step``
boolean                                     checkbox
enum, or ``oneOf`` of ``const`` + title     one button each (a lone field with up to
                                            three choices), radios (up to six), select
array of strings / numbers                  repeatable inputs
array whose items are an enum               checkboxes
object with properties                      a fieldset of its fields
anything else                               a JSON text area, parsed and validated
==========================================  ===========================================

Names of inputs are ``answer`` followed by the field's JSON pointer
(``answer/address/city``), so a name says where its value goes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from django.http import QueryDict
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from runs.schemas import SchemaProblem, schema_problems

ROOT_NAME = "answer"
# A lone choice with this many options or fewer becomes one button per option (docs/dashboard.md).
MAX_BUTTON_CHOICES = 3
MAX_RADIO_CHOICES = 6
TEXTAREA_OVER = 200


class _Missing:
    """No value was given (distinct from ``None``, which is JSON ``null``)."""

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


@dataclass
class Choice:
    token: str  # what the HTML input carries: the option's index, never the raw value
    value: Any
    label: str


@dataclass
class SchemaField:
    pointer: str  # JSON pointer of the value, "" for the root
    key: str  # the property name in the parent object
    name: str  # HTML name
    html_id: str
    label: str
    help: str
    required: bool
    widget: str
    schema: dict[str, Any]
    choices: list[Choice] = field(default_factory=list)
    children: list[SchemaField] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)
    # What the inputs show: a string for single inputs, a list of strings for
    # repeatable ones, a set of tokens for choices, a bool for a checkbox.
    shown: Any = ""
    errors: list[str] = field(default_factory=list)
    item_type: str = ""

    @property
    def shown_lines(self) -> str:
        """A list's values one per line, for the textarea shown without JavaScript."""
        if isinstance(self.shown, list):
            return "\n".join(v for v in self.shown if v)
        return ""

    @property
    def is_fieldset(self) -> bool:
        return self.widget == "fieldset"

    @property
    def describedby(self) -> str:
        ids = []
        if self.help:
            ids.append(f"{self.html_id}-help")
        if self.errors:
            ids.append(f"{self.html_id}-error")
        return " ".join(ids)


def _escape_pointer_part(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def _type_of(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        kind = others[0] if len(others) == 1 else None
    if kind is None and isinstance(schema.get("properties"), dict):
        return "object"
    return kind if isinstance(kind, str) else ""


def _choices_of(schema: dict[str, Any]) -> list[Choice] | None:
    """The options of an enum (``enum``, or ``oneOf``/``anyOf`` of ``const`` with titles)."""
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return [
            Choice(token=str(i), value=v, label=_label_of_value(v))
            for i, v in enumerate(schema["enum"])
        ]
    for key in ("oneOf", "anyOf"):
        options = schema.get(key)
        if (
            isinstance(options, list)
            and options
            and all(isinstance(o, dict) and "const" in o for o in options)
        ):
            return [
                Choice(
                    token=str(i),
                    value=o["const"],
                    label=str(o.get("title") or _label_of_value(o["const"])),
                )
                for i, o in enumerate(options)
            ]
    return None


def _ordered_properties(schema: dict[str, Any]) -> list[tuple[str, Any]]:
    """Required fields first, in the order of ``required``, then the others as given.

    PostgreSQL's jsonb does not keep the order of object keys, but it keeps lists, so
    ``required`` is the one order an agent can rely on everywhere.
    """
    properties: dict[str, Any] = schema["properties"]
    required = [k for k in schema.get("required") or [] if isinstance(k, str) and k in properties]
    rest = [k for k in properties if k not in required]
    return [(k, properties[k]) for k in [*dict.fromkeys(required), *rest]]


def _label_of_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _humanize(key: str) -> str:
    return capfirst(key.replace("_", " ").replace("-", " ").strip()) or key


def _number_text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class SchemaForm:
    """A form for ``schema``; bound when ``data`` (a QueryDict) is given."""

    def __init__(
        self,
        schema: Any,
        data: QueryDict | None = None,
        *,
        prefix: str = "f",
        initial: Any = MISSING,
        allow_buttons: bool = True,
    ) -> None:
        self.schema = schema if isinstance(schema, dict) else {}
        self.data = data
        self.prefix = prefix
        self.errors: list[str] = []  # errors that belong to no one field
        self._counter = 0
        self._fields_by_pointer: dict[str, SchemaField] = {}
        self.value: Any = MISSING
        self._validated = False
        root_is_object = _type_of(self.schema) == "object" and isinstance(
            self.schema.get("properties"), dict
        )
        if root_is_object:
            self.root = self._build(
                self.schema, pointer="", name=ROOT_NAME, key="", required=True, initial=initial
            )
        else:
            self.root = self._build(
                self.schema,
                pointer="",
                name=ROOT_NAME,
                key=_("Answer"),
                required=True,
                initial=initial,
            )
        self.buttons: list[Choice] = []
        self.button_field: SchemaField | None = None
        if allow_buttons:
            self._choose_buttons()

    # --- Building -------------------------------------------------------------------------

    def _next_id(self) -> str:
        self._counter += 1
        return f"{self.prefix}-f{self._counter}"

    def _build(
        self,
        schema: Any,
        *,
        pointer: str,
        name: str,
        key: str,
        required: bool,
        initial: Any,
    ) -> SchemaField:
        if not isinstance(schema, dict):
            schema = {}
        if initial is MISSING and "default" in schema:
            initial = schema["default"]
        label = str(schema.get("title") or (_humanize(key) if key else ""))
        help_text = str(schema.get("description") or "")
        made = SchemaField(
            pointer=pointer,
            key=key,
            name=name,
            html_id=self._next_id(),
            label=label,
            help=help_text,
            required=required,
            widget="json",
            schema=schema,
        )
        self._fields_by_pointer[pointer] = made
        kind = _type_of(schema)
        choices = _choices_of(schema)
        if "const" in schema:
            made.widget = "const"
            made.shown = _label_of_value(schema["const"])
        elif choices is not None:
            made.choices = choices
            made.widget = "radio" if len(choices) <= MAX_RADIO_CHOICES else "select"
            made.shown = {c.token for c in choices if initial is not MISSING and c.value == initial}
        elif kind == "object" and isinstance(schema.get("properties"), dict):
            made.widget = "fieldset"
            required_keys = schema.get("required") or []
            values = initial if isinstance(initial, dict) else {}
            for child_key, child_schema in _ordered_properties(schema):
                part = _escape_pointer_part(str(child_key))
                made.children.append(
                    self._build(
                        child_schema,
                        pointer=f"{pointer}/{part}",
                        name=f"{name}/{part}",
                        key=str(child_key),
                        required=child_key in required_keys,
                        initial=values.get(child_key, MISSING),
                    )
                )
        elif kind == "string":
            made.widget = self._string_widget(schema, made.attrs)
            made.shown = initial if isinstance(initial, str) else ""
        elif kind in ("integer", "number"):
            made.widget = "number"
            made.attrs.update(self._number_attrs(schema, kind))
            made.shown = _number_text(initial) if initial is not MISSING else ""
        elif kind == "boolean":
            made.widget = "checkbox"
            made.shown = initial is True
        elif kind == "array" and isinstance(schema.get("items"), dict):
            items = schema["items"]
            item_choices = _choices_of(items)
            item_kind = _type_of(items)
            chosen: list[Any] = initial if isinstance(initial, list) else []
            if item_choices is not None:
                made.widget = "checkboxes"
                made.choices = item_choices
                made.shown = {c.token for c in item_choices if c.value in chosen}
            elif item_kind in ("string", "integer", "number"):
                made.widget = "list"
                made.item_type = item_kind
                if item_kind == "string":
                    self._string_widget(items, made.attrs)
                else:
                    made.attrs.update(self._number_attrs(items, item_kind))
                shown = [_number_text(v) if item_kind != "string" else str(v) for v in chosen]
                made.shown = self._list_slots(schema, shown)
        if made.widget == "json":
            made.shown = (
                json.dumps(initial, ensure_ascii=False, indent=2) if initial is not MISSING else ""
            )
        return made

    @staticmethod
    def _list_slots(schema: dict[str, Any], shown: list[str]) -> list[str]:
        """The values shown, plus one empty input to add another (at least ``minItems``)."""
        slots = [*shown, ""]
        minimum = schema.get("minItems")
        if isinstance(minimum, int):
            slots += [""] * max(0, minimum - len(slots))
        maximum = schema.get("maxItems")
        if isinstance(maximum, int):
            slots = slots[: max(maximum, len(shown), 1)]
        return slots

    @staticmethod
    def _string_widget(schema: dict[str, Any], attrs: dict[str, str]) -> str:
        max_length = schema.get("maxLength")
        min_length = schema.get("minLength")
        if isinstance(max_length, int):
            attrs["maxlength"] = str(max_length)
        if isinstance(min_length, int):
            attrs["minlength"] = str(min_length)
        if isinstance(schema.get("pattern"), str):
            attrs["pattern"] = schema["pattern"]
        fmt = schema.get("format")
        if fmt == "date":
            return "date"
        if fmt == "email":
            return "email"
        if fmt in ("uri", "url"):
            return "url"
        if isinstance(max_length, int) and max_length > TEXTAREA_OVER:
            return "textarea"
        return "text"

    @staticmethod
    def _number_attrs(schema: dict[str, Any], kind: str) -> dict[str, str]:
        attrs: dict[str, str] = {}
        step = schema.get("multipleOf")
        attrs["step"] = _number_text(step) if step else ("1" if kind == "integer" else "any")
        for key, attr in (("minimum", "min"), ("maximum", "max")):
            bound = schema.get(key)
            if isinstance(bound, int | float) and not isinstance(bound, bool):
                attrs[attr] = _number_text(bound)
        if kind == "integer":
            attrs["inputmode"] = "numeric"
        return attrs

    def _choose_buttons(self) -> None:
        """A lone required choice with few options is answered by one click (docs/dashboard.md)."""
        if not self.root.is_fieldset or len(self.root.children) != 1:
            return
        only = self.root.children[0]
        if only.widget == "radio" and only.required and len(only.choices) <= MAX_BUTTON_CHOICES:
            self.buttons = only.choices
            self.button_field = only

    # --- Reading a submission ------------------------------------------------------------

    def fields(self) -> list[SchemaField]:
        """The fields to render: the root's children when the root is an object."""
        return self.root.children if self.root.is_fieldset else [self.root]

    def is_valid(self) -> bool:
        if self.data is None:
            return False
        if not self._validated:
            self._validated = True
            self.value = self._parse(self.root)
            if self.value is MISSING:
                self.value = {} if self.root.is_fieldset else None
            if not self._has_errors():
                self._validate(self.value)
        return not self._has_errors()

    def _has_errors(self) -> bool:
        return bool(self.errors) or any(f.errors for f in self._fields_by_pointer.values())

    def _parse(self, f: SchemaField) -> Any:
        assert self.data is not None
        data = self.data
        if f.widget == "fieldset":
            result: dict[str, Any] = {}
            for child in f.children:
                value = self._parse(child)
                if value is not MISSING:
                    result[child.key] = value
            if not result and not f.required:
                return MISSING
            return result
        if f.widget == "const":
            return f.schema["const"]
        if f.widget in ("radio", "select"):
            token = data.get(f.name, "")
            f.shown = {token}
            if token == "":
                return MISSING
            for choice in f.choices:
                if choice.token == token:
                    return choice.value
            f.errors.append(_("Choose one of the options."))
            return MISSING
        if f.widget == "checkboxes":
            tokens = [t for t in data.getlist(f.name) if t != ""]
            f.shown = set(tokens)
            by_token = {c.token: c.value for c in f.choices}
            if any(t not in by_token for t in tokens):
                f.errors.append(_("Choose among the options."))
                return MISSING
            if not tokens and not f.required:
                return MISSING
            # Keep the order of the options, not the order the browser sent them in.
            return [c.value for c in f.choices if c.token in tokens]
        if f.widget == "checkbox":
            checked = data.get(f.name, "") not in ("", "false", "0", "off")
            f.shown = checked
            return checked
        if f.widget == "number":
            raw = data.get(f.name, "").strip()
            f.shown = raw
            if raw == "":
                return MISSING
            number = self._number(raw, f.schema, f)
            return MISSING if number is None else number
        if f.widget == "list":
            # One value per input (JavaScript) or one per line of the textarea (without it).
            raw_items = [line for raw in data.getlist(f.name) for line in raw.splitlines()]
            f.shown = self._list_slots(f.schema, [r for r in raw_items if r.strip()])
            items: list[Any] = []
            for raw in raw_items:
                text = raw.strip()
                if not text:
                    continue
                if f.item_type == "string":
                    items.append(text)
                else:
                    number = self._number(text, f.schema.get("items") or {}, f)
                    if number is not None:
                        items.append(number)
            if not items and not f.required:
                return MISSING
            return items
        if f.widget == "json":
            raw = data.get(f.name, "")
            f.shown = raw
            if not raw.strip():
                return MISSING
            try:
                return json.loads(raw)
            except ValueError as exc:
                f.errors.append(_("Enter valid JSON (%(problem)s).") % {"problem": exc})
                return MISSING
        # text, textarea, date, email, url
        raw = data.get(f.name, "")
        value = raw if f.widget == "textarea" else raw.strip()
        f.shown = value
        if not value.strip():
            return MISSING
        return value

    @staticmethod
    def _number(raw: str, schema: dict[str, Any], f: SchemaField) -> int | float | None:
        kind = _type_of(schema)
        try:
            number = Decimal(raw)
        except InvalidOperation:
            number = None
        if number is None or not number.is_finite():
            f.errors.append(
                _("Enter a whole number.") if kind == "integer" else _("Enter a number.")
            )
            return None
        if kind == "integer":
            if number != number.to_integral_value():
                f.errors.append(_("Enter a whole number."))
                return None
            return int(number)
        as_float = float(number)
        if math.isfinite(as_float) and number == number.to_integral_value() and "." not in raw:
            return int(number)
        return as_float

    # --- Validation ----------------------------------------------------------------------

    def _validate(self, value: Any) -> None:
        # The services' own validator (runs.schemas): what the form accepts, they accept.
        for problem in schema_problems(self.schema, value):
            self.add_error(problem.pointer, _message_of(problem))

    def add_error(self, pointer: str, message: str) -> None:
        """Put ``message`` on the field ``pointer`` names, or the nearest field above it."""
        target = self._field_for(pointer)
        if target is None or (target is self.root and target.is_fieldset):
            self.errors.append(message)
            return
        message = self._naming_the_item(target, pointer, message)
        if message not in target.errors:
            target.errors.append(message)

    def _naming_the_item(self, target: SchemaField, pointer: str, message: str) -> str:
        """An error about one value of a list names that value (“v9”: Choose one of the
        options.): the field shows several, and the person must see which one is refused."""
        if target.widget not in ("list", "checkboxes") or not pointer.startswith(
            target.pointer + "/"
        ):
            return message
        index = pointer[len(target.pointer) + 1 :].split("/", 1)[0]
        items = self._value_at(target.pointer)
        if not index.isdigit() or not isinstance(items, list) or int(index) >= len(items):
            return message
        item = _label_of_value(items[int(index)])
        return _("“%(item)s”: %(message)s") % {
            "item": item if len(item) <= 60 else item[:59] + "…",
            "message": message,
        }

    def _value_at(self, pointer: str) -> Any:
        """The parsed value at ``pointer`` (MISSING when there is none)."""
        value = self.value
        for part in pointer.split("/")[1:] if pointer else []:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(value, dict) and key in value:
                value = value[key]
            elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            else:
                return MISSING
        return value

    def add_errors(self, errors: list[dict[str, str]]) -> None:
        """Errors as the services give them: ``{pointer, message}``."""
        for error in errors:
            self.add_error(error.get("pointer", "/"), error.get("message", ""))

    def _field_for(self, pointer: str) -> SchemaField | None:
        pointer = "" if pointer == "/" else pointer
        while True:
            if pointer in self._fields_by_pointer:
                return self._fields_by_pointer[pointer]
            if not pointer:
                return None
            pointer = pointer.rsplit("/", 1)[0]


FORMAT_WORDS = {
    "email": gettext_lazy("Must be an e-mail address."),
    "idn-email": gettext_lazy("Must be an e-mail address."),
    "date": gettext_lazy("Must be a date (year-month-day)."),
    "date-time": gettext_lazy("Must be a date and time."),
    "time": gettext_lazy("Must be a time of day."),
    "uri": gettext_lazy("Must be a web address (https://…)."),
    "url": gettext_lazy("Must be a web address (https://…)."),
    "hostname": gettext_lazy("Must be a host name."),
    "ipv4": gettext_lazy("Must be an IPv4 address."),
    "ipv6": gettext_lazy("Must be an IPv6 address."),
    "uuid": gettext_lazy("Must be a UUID."),
}
TYPE_WORDS = {
    "string": gettext_lazy("text"),
    "integer": gettext_lazy("a whole number"),
    "number": gettext_lazy("a number"),
    "boolean": gettext_lazy("yes or no"),
    "array": gettext_lazy("a list"),
    "object": gettext_lazy("a group of fields"),
    "null": gettext_lazy("nothing"),
}


def _shape_words(schema: dict[str, Any]) -> str:
    """What a value must look like, in the words the agent gave (format, then description,
    then title); never the regular expression itself."""
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in FORMAT_WORDS:
        return str(FORMAT_WORDS[fmt])
    described = schema.get("description") or schema.get("title")
    if isinstance(described, str) and described.strip():
        return _("Must be: %(what)s.") % {"what": described.strip().rstrip(".")}
    return _("This value is not in the form this field expects.")


def _message_of(problem: SchemaProblem) -> str:
    """A sentence a person understands, for the validators forms meet most."""
    kind = problem.kind
    bound = problem.bound
    if kind == "required":
        return _("This field is required.")
    if kind in ("pattern", "format"):
        return _shape_words(problem.schema)
    if kind == "minimum":
        return _("Must be at least %(bound)s.") % {"bound": _number_text(bound)}
    if kind == "maximum":
        return _("Must be at most %(bound)s.") % {"bound": _number_text(bound)}
    if kind == "exclusiveMinimum":
        return _("Must be more than %(bound)s.") % {"bound": _number_text(bound)}
    if kind == "exclusiveMaximum":
        return _("Must be less than %(bound)s.") % {"bound": _number_text(bound)}
    if kind == "minLength" and isinstance(bound, int):
        return ngettext(
            "Must be at least %(n)d character.", "Must be at least %(n)d characters.", bound
        ) % {"n": bound}
    if kind == "maxLength" and isinstance(bound, int):
        return ngettext(
            "Must be at most %(n)d character.", "Must be at most %(n)d characters.", bound
        ) % {"n": bound}
    if kind == "minItems" and isinstance(bound, int):
        return ngettext("Give at least %(n)d item.", "Give at least %(n)d items.", bound) % {
            "n": bound
        }
    if kind == "maxItems" and isinstance(bound, int):
        return ngettext("Give at most %(n)d item.", "Give at most %(n)d items.", bound) % {
            "n": bound
        }
    if kind == "uniqueItems":
        return _("Each item must be different.")
    if kind in ("enum", "const"):
        return _("Choose one of the options.")
    if kind == "type":
        kinds = [bound] if isinstance(bound, str) else [str(k) for k in bound]
        wanted = _(" or ").join(str(TYPE_WORDS.get(k, k)) for k in kinds)
        return _("Must be %(type)s.") % {"type": wanted}
    if kind == "multipleOf":
        return _("Must be a multiple of %(bound)s.") % {"bound": _number_text(bound)}
    return _("This value is not accepted here.")
