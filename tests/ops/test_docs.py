"""The README is short and leads to every document; the documents state the current truth.

- README.md fits in 250 lines, shows `make run` and `make test` before anything else, and
  links to every file in docs/;
- no `<!-- issue N -->` markers, no figure markers that a script writes between;
- every relative link in README.md, docs/ and bench/results/ leads to a file that exists,
  and every `#anchor` to a heading of that file (images are left out: the screenshot is
  produced by the browser tests);
- every environment variable that config/settings.py reads is a row of the configuration
  table in docs/operations.md, and no other document has a table row for one;
- docs/performance.md stays a document (at most ~300 lines, no pasted figure blocks).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RESULTS = sorted((ROOT / "bench" / "results").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _prose(path: Path) -> str:
    """The text of a Markdown file without its code blocks."""
    return FENCE.sub("", path.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {
        _slug(line.lstrip("#")) for line in _prose(path).splitlines() if re.match(r"^#{1,6} ", line)
    }


def test_it_keeps_the_readme_short_with_the_two_commands_first() -> None:
    text = README.read_text()
    lines = text.splitlines()

    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move sections to docs/"
    before_first_section = text.split("\n## ", 1)[0]
    assert "make run" in before_first_section
    assert "make test" in before_first_section


def test_it_links_every_document_from_the_readme() -> None:
    linked = {target for target in LINK.findall(README.read_text())}

    missing = [f"docs/{doc.name}" for doc in DOCS if f"docs/{doc.name}" not in linked]
    assert not missing, f"README.md does not link to {missing}"


@pytest.mark.parametrize("path", [README, *DOCS, *RESULTS], ids=lambda p: p.name)
def test_it_has_no_issue_or_generated_figure_markers(path: Path) -> None:
    text = path.read_text()

    assert not re.search(r"<!--\s*issue", text), "an <!-- issue N --> marker"
    assert not re.search(r"<!--\s*(bench|chaos|analysis):", text), "a generated-figures marker"
    assert "in this issue" not in text, "narration of an issue; state the current truth"


@pytest.mark.parametrize("path", [README, *DOCS, *RESULTS], ids=lambda p: p.name)
def test_it_links_only_to_files_and_headings_that_exist(path: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(path)):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        missing_anchor = anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        if not linked.exists() or missing_anchor:
            broken.append(target)

    assert not broken, f"{path.relative_to(ROOT)} links to what does not exist: {broken}"


def _settings_variables() -> set[str]:
    source = (ROOT / "config" / "settings.py").read_text()
    return set(re.findall(r"env_\w+\(\s*\"([A-Z][A-Z0-9_]+)\"", source))


def _table_variables(path: Path) -> set[str]:
    """Variables a table row is about: its first cell is nothing but variable names
    (`` `A`, `B` ``). A row of prose that mentions one in passing does not count."""
    names: set[str] = set()
    for line in _prose(path).splitlines():
        match = re.match(r"^\|([^|]+)\|", line)
        if match and re.fullmatch(
            r"\s*`[A-Z][A-Z0-9_]{2,}`(\s*,\s*`[A-Z][A-Z0-9_]{2,}`)*\s*", match.group(1)
        ):
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]{2,})`", match.group(1)))
    return names


def test_it_lists_every_environment_variable_once_in_the_configuration_table() -> None:
    variables = _settings_variables()
    assert {"DATABASE_URL", "HOLDPOINT_LEASE_SECONDS", "EMAIL_TIMEOUT"} <= variables

    operations = ROOT / "docs" / "operations.md"
    missing = variables - _table_variables(operations)
    assert not missing, f"docs/operations.md's configuration table lacks {sorted(missing)}"
    for path in [README, *DOCS]:
        if path == operations:
            continue
        listed = _table_variables(path) & variables
        assert not listed, f"{path.name} lists {sorted(listed)}; link to the configuration table"


def test_it_keeps_the_performance_page_a_document() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()

    assert len(text.splitlines()) <= 300
    assert "EXPLAIN ANALYZE of every query at" not in text
    assert "<details>" not in text


# --- Claims of docs/agents.md, docs/tools.md and docs/dashboard.md checked against the code
# (issue 26: each was found wrong or missing by an author writing from the docs alone).


def test_the_ctx_table_names_every_parameter_of_each_call_in_order() -> None:
    import inspect

    from runtime.sdk import Context

    rows = re.findall(
        r"^\| `ctx\.(\w+)\(([^)]*)\)`", (ROOT / "docs" / "agents.md").read_text(), re.M
    )
    assert {"ask", "choose", "approve", "side_effect"} <= {name for name, _ in rows}
    for name, params in rows:
        documented = [p.strip().split("=")[0].lstrip("*") for p in params.split(",") if p.strip()]
        actual = [p for p in inspect.signature(getattr(Context, name)).parameters if p != "self"]
        if actual[-1:] == ["kwargs"] and documented[-1:] != ["kwargs"]:
            actual = actual[:-1]  # ctx.observe passes keyword arguments on to `read`
        assert documented == actual, f"ctx.{name}: the table says {documented}, the code {actual}"


def test_the_harness_example_runs_as_written() -> None:
    """The crash example of docs/agents.md is run: its answers fit the agent's questions and
    its decisions are what the harness records for the demo agent's shape."""
    blocks = re.findall(
        r"^```python\n(.*?)^```", (ROOT / "docs" / "agents.md").read_text(), re.M | re.S
    )
    [example] = [b for b in blocks if "def test_a_crash_between_the_act_and_the_record" in b]
    names: dict[str, object] = {}
    exec(compile(example, "docs/agents.md", "exec"), names)  # our own document, run as written
    tests = [f for n, f in names.items() if n.startswith("test_") and callable(f)]
    assert len(tests) == 2
    for test in tests:
        test()


def test_every_path_the_demo_receiver_serves_is_in_the_webhook_docs() -> None:
    import runtime.demo_receiver

    served = re.findall(r"``((?:GET|POST) /[^`]*)``", runtime.demo_receiver.__doc__ or "")
    assert len(served) == 4, served
    tools = _prose(ROOT / "docs" / "tools.md")
    for path in served:
        assert f"`{path}" in tools, f"docs/tools.md does not say what {path} does"


def test_every_part_a_push_replaces_has_its_id_in_the_stable_ids() -> None:
    """docs/dashboard.md lists the ids a live push swaps in by; each is an element of a
    template, and every element a template marks for an out-of-band swap is listed."""
    text = (ROOT / "docs" / "dashboard.md").read_text()
    section = text.split("### Stable element ids", 1)[1].split("###", 1)[0]
    listed = set(re.findall(r"`([a-z<>_-]+)`", section.split("`<id>` is", 1)[0]))
    templates = (
        "".join(path.read_text() for path in (ROOT / "dashboard" / "templates").rglob("*.html"))
        + (ROOT / "templates" / "base.html").read_text()
    )
    templates = templates.replace("{{ card.html_id }}", "request-{{ req.id }}")
    ids = {
        re.sub(r"\{\{[^}]*\}\}", "<id>", found).replace("effect-<id>", "effect-<operation_id>")
        for found in re.findall(r'<[^>]* id="([^"]+)"[^>]*hx-swap-oob', templates)
    }
    assert ids, "no out-of-band parts found"
    assert ids - listed == set(), f"not in the stable ids: {sorted(ids - listed)}"
    for name in listed:
        pattern = re.escape(name).replace(re.escape("<id>"), r"\{\{[^}]*\}\}")
        pattern = pattern.replace(re.escape("<operation_id>"), r"\{\{[^}]*\}\}")
        assert re.search(f'id="{pattern}"', templates), f"no element has the id {name}"
    assert "#run-pending" not in _prose(ROOT / "docs" / "dashboard.md").replace("…#run-pending", "")
