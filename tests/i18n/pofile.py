"""A small reader of gettext catalogs: the ``.po`` files we write and the ``.mo`` files
compiled from them, so the tests can check both without gettext's tools (CI may not
have them) or another dependency."""

from __future__ import annotations

import ast
import gettext
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Entry:
    msgid: str = ""
    msgid_plural: str = ""
    msgctxt: str | None = None
    msgstr: dict[int, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    obsolete: bool = False

    @property
    def key(self) -> str:
        """The key of this entry in a compiled catalog (context and id joined by EOT)."""
        return self.msgid if self.msgctxt is None else f"{self.msgctxt}\x04{self.msgid}"

    @property
    def fuzzy(self) -> bool:
        return "fuzzy" in self.flags

    @property
    def translated(self) -> bool:
        return bool(self.msgstr) and all(self.msgstr.values())


def _string(text: str) -> str:
    """One quoted PO string (C escapes, as Python's are a superset for what PO uses)."""
    value = ast.literal_eval(text)
    assert isinstance(value, str)
    return value


def read_po(path: Path) -> list[Entry]:
    """Every entry of ``path`` in file order, the header (msgid "") included."""
    entries: list[Entry] = []
    entry = Entry()
    seen = False
    target: tuple[str, int] | None = None

    def finish() -> None:
        nonlocal entry, seen, target
        if seen:
            entries.append(entry)
        entry, seen, target = Entry(), False, None

    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#~"):
            entry.obsolete = True
            line = line[2:].strip()
            if not line:
                continue
        if not line:
            finish()
            continue
        if line.startswith("#,"):
            entry.flags |= {f.strip() for f in line[2:].split(",") if f.strip()}
            continue
        if line.startswith("#"):
            continue
        keyword, _sep, rest = line.partition(" ")
        if line.startswith('"'):
            if target is None:
                raise ValueError(f"{path}: a string continues nothing: {raw!r}")
            name, index = target
            _append(entry, name, index, _string(line))
            continue
        if keyword in ("msgctxt", "msgid") and entry.msgstr:
            finish()  # the next entry starts without a blank line between
        seen = True
        if keyword == "msgctxt":
            entry.msgctxt = ""
            target = ("msgctxt", 0)
        elif keyword == "msgid":
            target = ("msgid", 0)
        elif keyword == "msgid_plural":
            target = ("msgid_plural", 0)
        elif keyword == "msgstr":
            target = ("msgstr", 0)
            entry.msgstr.setdefault(0, "")
        elif keyword.startswith("msgstr[") and keyword.endswith("]"):
            target = ("msgstr", int(keyword[7:-1]))
            entry.msgstr.setdefault(target[1], "")
        else:
            raise ValueError(f"{path}: cannot read {raw!r}")
        _append(entry, target[0], target[1], _string(rest))
    finish()
    return entries


def _append(entry: Entry, name: str, index: int, text: str) -> None:
    if name == "msgstr":
        entry.msgstr[index] = entry.msgstr.get(index, "") + text
    elif name == "msgctxt":
        entry.msgctxt = (entry.msgctxt or "") + text
    else:
        setattr(entry, name, getattr(entry, name) + text)


def po_catalog(entries: list[Entry]) -> dict[object, str]:
    """What ``msgfmt`` compiles from ``entries``: translated, non-fuzzy, non-obsolete ones."""
    catalog: dict[object, str] = {}
    for e in entries:
        if e.obsolete or e.fuzzy or not e.msgid or not e.translated:
            continue
        if e.msgid_plural:
            for index, text in e.msgstr.items():
                catalog[(e.key, index)] = text
        else:
            catalog[e.key] = e.msgstr[0]
    return catalog


def mo_catalog(path: Path) -> dict[object, str]:
    """The messages of a compiled ``.mo`` file, its header left out."""
    with path.open("rb") as handle:
        translations = gettext.GNUTranslations(handle)
    catalog: dict[object, str] = translations._catalog  # type: ignore[attr-defined]
    return {k: v for k, v in catalog.items() if k != ""}
