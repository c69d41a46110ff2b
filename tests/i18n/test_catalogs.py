"""The Chinese catalogs in ``locale/``: complete, not fuzzy, placeholders kept, compiled.

The ``.mo`` files are committed (CI machines may lack GNU gettext), so a ``.po`` edited
without ``make messages`` would silently show stale text: the compiled catalog must say
exactly what its ``.po`` says. And every string the code marks for translation must be
in the ``.po``: a new ``{% translate %}`` without ``make messages`` fails here, with
the strings to translate, not in front of a Chinese-speaking user.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest
from django.utils.translation.template import templatize

from tests.i18n.pofile import Entry, mo_catalog, po_catalog, read_po

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = ROOT / "locale" / "zh_Hans" / "LC_MESSAGES"
DOMAINS = ("django", "djangojs")
# What `make messages` leaves out of the catalog (the Makefile's MESSAGES_IGNORE).
IGNORED = {".venv", "var", "test-output", "tests", "bench", "node_modules", ".git"}
CHINESE = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")  # CJK text, CJK punctuation
PLACEHOLDER = re.compile(r"%\(\w+\)[-#0 +]*\d*(?:\.\d+)?[sdrfi]|\{\}")
KEYWORDS = {
    "_": (1,),
    "gettext": (1,),
    "gettext_lazy": (1,),
    "gettext_noop": (1,),
    "ngettext": (1, 2),
    "ngettext_lazy": (1, 2),
    "pgettext": ("c", 2),
    "pgettext_lazy": ("c", 2),
    "npgettext": ("c", 2, 3),
    "npgettext_lazy": ("c", 2, 3),
}


def entries(domain: str) -> list[Entry]:
    return [e for e in read_po(MESSAGES / f"{domain}.po") if e.msgid and not e.obsolete]


def source_files(*suffixes: str) -> list[Path]:
    return sorted(
        path
        for path in ROOT.rglob("*")
        if path.suffix in suffixes
        and path.is_file()
        and not IGNORED & set(path.relative_to(ROOT).parts)
    )


def marked_strings(source: str) -> set[tuple[str | None, str]]:
    """(context, msgid) of every call of a gettext keyword with literal strings, found the
    way xgettext finds them: by the tokens, not by running anything."""
    lines = "\n".join(line.lstrip() for line in source.splitlines())  # no indentation rules
    tokens = [
        t
        for t in tokenize.generate_tokens(io.StringIO(lines).readline)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    ]
    found: set[tuple[str | None, str]] = set()
    for i, token in enumerate(tokens[:-2]):
        if token.type != tokenize.NAME or token.string not in KEYWORDS:
            continue
        if tokens[i + 1].string != "(" or tokens[i + 2].type != tokenize.STRING:
            continue
        args: list[str] = []
        j = i + 2
        while j < len(tokens):
            text = ""
            while j < len(tokens) and tokens[j].type == tokenize.STRING:
                text += ast.literal_eval(tokens[j].string)  # implicit concatenation too
                j += 1
            args.append(text)
            if j >= len(tokens) or tokens[j].string != "," or tokens[j + 1].type != tokenize.STRING:
                break
            j += 1
        spec = KEYWORDS[token.string]
        context = args[0] if spec[0] == "c" else None
        msgid_at = 1 if spec[0] == "c" else 0
        if len(args) > msgid_at:
            found.add((context, args[msgid_at]))
    return found


def code_strings() -> dict[str, set[tuple[str | None, str]]]:
    django: set[tuple[str | None, str]] = set()
    for path in source_files(".py"):
        django |= marked_strings(path.read_text(encoding="utf-8"))
    for path in source_files(".html", ".txt"):
        django |= marked_strings(templatize(path.read_text(encoding="utf-8"), origin=str(path)))
    javascript: set[tuple[str | None, str]] = set()
    for path in source_files(".js"):
        if "static" in path.relative_to(ROOT).parts:
            for match in re.finditer(r'\bgettext\(("(?:[^"\\]|\\.)*")\)', path.read_text()):
                javascript.add((None, json.loads(match.group(1))))
    return {"django": django, "djangojs": javascript}


def test_it_finds_the_strings_the_code_marks() -> None:
    """The extractor itself: a few strings from each kind of source."""
    found = code_strings()
    assert (None, "Inbox") in found["django"]  # {% translate %}
    assert (None, "%(n)s line") in found["django"]  # {% blocktranslate count %}
    assert (None, "Waiting for approval") in found["django"]  # TextChoices label
    assert ("date and time format", "M j, H:i") in found["django"]  # pgettext
    assert (None, "Closed: run cancelled") in found["django"]  # gettext_noop in a service
    assert (None, "%(d)sd %(h)sh") in found["djangojs"]  # app.js
    assert len(found["django"]) > 300


@pytest.mark.parametrize("domain", DOMAINS)
def test_it_has_every_string_the_code_marks(domain: str) -> None:
    in_po = {(e.msgctxt, e.msgid) for e in entries(domain)}
    missing = sorted(code_strings()[domain] - in_po, key=str)
    assert missing == [], f"run `make messages` and translate these in {domain}.po: {missing}"


@pytest.mark.parametrize("domain", DOMAINS)
def test_it_translates_every_string_and_none_is_fuzzy(domain: str) -> None:
    found = entries(domain)
    assert found
    untranslated = [e.msgid for e in found if not e.translated]
    fuzzy = [e.msgid for e in found if e.fuzzy]
    assert untranslated == []
    assert fuzzy == []
    header = read_po(MESSAGES / f"{domain}.po")[0]
    assert header.msgid == "" and not header.fuzzy
    assert "Plural-Forms: nplurals=1; plural=0;" in header.msgstr[0]
    assert "Language: zh_Hans" in header.msgstr[0]


@pytest.mark.parametrize("domain", DOMAINS)
def test_it_keeps_placeholders_and_uses_one_plural_form(domain: str) -> None:
    for e in entries(domain):
        wanted = sorted(PLACEHOLDER.findall(e.msgid_plural or e.msgid))
        if e.msgid_plural:
            # Chinese has one form, which reads like the English plural.
            assert list(e.msgstr) == [0], e.msgid
        for text in e.msgstr.values():
            assert sorted(PLACEHOLDER.findall(text)) == wanted, (e.msgid, text)
        # It is Chinese, not the English copied over (a few words stay as they are).
        if e.msgid not in {"Ctrl+Enter"}:
            assert CHINESE.search(e.msgstr[0]), e.msgid


@pytest.mark.parametrize("domain", DOMAINS)
def test_it_commits_the_compiled_catalog_of_the_po_file(domain: str) -> None:
    compiled = mo_catalog(MESSAGES / f"{domain}.mo")
    written = po_catalog(read_po(MESSAGES / f"{domain}.po"))
    stale = {k: (written.get(k), compiled.get(k)) for k in written.keys() | compiled.keys()}
    stale = {k: v for k, v in stale.items() if v[0] != v[1]}
    assert stale == {}, "run `make messages` (or compilemessages) and commit the .mo files"
