"""The documentation site as a reader gets it: built once with ``mkdocs build --strict``, then
checked for what would break it offline or make it look unfinished.

- the diagrams in ``docs/img`` are exactly what ``docs/diagrams/generate.py`` draws (no
  hand-edited or stale SVG), and no page still holds a Mermaid diagram;
- the built pages load nothing from the network: no script, stylesheet, font, image or frame
  from an ``http(s)://`` address, nothing that makes the theme fetch one at view time
  (a ``mermaid`` block, the repository-facts widget), and no ``url(http...)`` in a stylesheet;
- the API reference shows no raw Sphinx role (``:func:`...``` and friends): docstrings use
  Google style, and cross-references are written ``[`name`][exitsafe.name]``;
- every public name appears in the API reference, and every public name and each of its
  parameters is documented (tests/docs_api.py, shared with the conversion script).

The site build is skipped with a visible reason when mkdocs is not installed
(``pip install -e '.[docs]'``).
"""

from __future__ import annotations

import html.parser
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GENERATOR = DOCS / "diagrams" / "generate.py"

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_api  # noqa: E402  (tests/docs_api.py)


def _load_generator():
    spec = importlib.util.spec_from_file_location("exitsafe_docs_diagrams", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------ diagrams


def test_diagrams_are_what_the_generator_draws() -> None:
    drawn = _load_generator().render_all()
    assert drawn, "the generator draws nothing"
    stale = [
        name
        for name, content in drawn.items()
        if not (DOCS / "img" / name).exists()
        or (DOCS / "img" / name).read_text(encoding="utf-8") != content
    ]
    assert not stale, (
        f"docs/img/{', '.join(stale)} differ from what docs/diagrams/generate.py draws: "
        "run `.venv/bin/python docs/diagrams/generate.py` and commit the result"
    )


def test_benchmark_charts_are_drawn_from_the_reference_run() -> None:
    """docs/img/teardown.svg and hot-path.svg are what benchmarks/svgplot.py draws from the
    committed reference run, whose tables the performance page shows."""
    import json

    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import svgplot
    finally:
        sys.path.remove(str(ROOT))
    results = json.loads((ROOT / "benchmarks/results/reference.json").read_text("utf-8"))
    note = results["meta"].get("summary", "")
    drawn = {
        "teardown.svg": svgplot.teardown_chart(results["sections"]["teardown"], note=note),
        "hot-path.svg": svgplot.hot_path_chart(results["sections"]["hot_path"], note=note),
    }
    page = (DOCS / "performance.md").read_text(encoding="utf-8")
    for name, content in drawn.items():
        assert (DOCS / "img" / name).read_text(encoding="utf-8") == content, (
            f"docs/img/{name} is not what benchmarks/svgplot.py draws from "
            "benchmarks/results/reference.json: redraw it with `.venv/bin/python -m "
            "benchmarks.svgplot [--hot-path] benchmarks/results/reference.json docs/img/...`"
        )
        assert f"](img/{name})" in page, f"docs/performance.md does not show img/{name}"


def test_instruction_chart_and_table_are_the_committed_run() -> None:
    """docs/img/hot-path-instructions.svg and the two-cores table of the performance page
    show benchmarks/results/instructions.json (``python -m benchmarks.instructions``)."""
    import json

    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import instructions
    finally:
        sys.path.remove(str(ROOT))
    saved = json.loads((ROOT / "benchmarks/results/instructions.json").read_text("utf-8"))
    drawn = instructions.chart(saved["results"], note=saved.get("note", ""))
    assert (DOCS / "img/hot-path-instructions.svg").read_text(encoding="utf-8") == drawn, (
        "docs/img/hot-path-instructions.svg is not what benchmarks/instructions.py draws from "
        "benchmarks/results/instructions.json: `.venv/bin/python -m benchmarks.instructions "
        "--replot benchmarks/results/instructions.json docs/img/hot-path-instructions.svg`"
    )
    page = (DOCS / "performance.md").read_text(encoding="utf-8")
    assert "](img/hot-path-instructions.svg)" in page
    for name, row in saved["results"].items():
        for value in row.values():
            assert f"{value:,.0f}" in page, f"{name}: {value:,.0f} is not on the page"


def test_steady_state_and_scaling_tables_are_the_committed_runs() -> None:
    """The performance page shows benchmarks/results/steady.json (``python -m
    benchmarks.steady``) and the headline figures of benchmarks/results/scaling.json
    (``python -m benchmarks.scaling``)."""
    import json

    page = (DOCS / "performance.md").read_text(encoding="utf-8")
    steady = json.loads((ROOT / "benchmarks/results/steady.json").read_text("utf-8"))
    for ledger, rows in steady["results"].items():
        for name, row in rows.items():
            for value in row.values():
                assert f"{value:,.0f}" in page, f"{ledger} {name}: {value:,.0f} is not on the page"
    data = json.loads((ROOT / "benchmarks/results/scaling.json").read_text("utf-8"))["data"]
    for core in data["cores"]:
        reverse = data["chain"][core]["reverse"][-1]
        shown = [
            f"{reverse['seconds']:.3f} s",
            f"{data['registries'][core][-1]['seconds']:.3f} s",
            f"{data['ledger'][core][-1]['seconds']:.2f} s",
            f"+{data['exit'][core]['1000000']['exitsafe']['added_per_object_s'] * 1e6:.2f} µs"
            if core == "compiled"
            else f"+{data['exit'][core]['1000000']['exitsafe']['added_per_object_s'] * 1e6:.1f} µs",
        ]
        for figure in shown:
            assert figure in page, f"scaling ({core}): {figure} is not on the page"


def test_every_generated_diagram_is_used_or_announced() -> None:
    pages = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md"))
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    # exit-threads.svg is drawn for the threads page (docs/threads.md), written separately.
    pending = {"exit-threads.svg"}
    unused = [
        name
        for name in _load_generator().render_all()
        if f"img/{name}" not in pages and f"img/{name}" not in config and name not in pending
    ]
    assert not unused, f"diagrams drawn but shown nowhere: {unused}"


def test_no_mermaid_anywhere() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in [*DOCS.rglob("*.md"), ROOT / "mkdocs.yml", ROOT / "README.md"]
        if "mermaid" in p.read_text(encoding="utf-8").lower()
    ]
    assert not offenders, f"Mermaid diagrams are drawn by a script loaded from a CDN: {offenders}"


# ---------------------------------------------------------------------------------- the site


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"mkdocs is not installed ({exc}); pip install -e '.[docs]' to build the site")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed\n{proc.stdout}\n{proc.stderr}"
    return out


def test_mkdocs_build_strict(site: Path) -> None:
    assert (site / "index.html").exists()


def _pages(site: Path) -> Iterator[Tuple[str, str]]:
    for path in sorted(site.rglob("*.html")):
        yield path.relative_to(site).as_posix(), path.read_text(encoding="utf-8")


_EXTERNAL = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
# (tag, attribute) pairs that make a browser fetch something when the page is shown
_FETCHED = {
    ("script", "src"),
    ("img", "src"),
    ("img", "srcset"),
    ("source", "src"),
    ("source", "srcset"),
    ("iframe", "src"),
    ("embed", "src"),
    ("object", "data"),
    ("video", "src"),
    ("video", "poster"),
    ("audio", "src"),
    ("track", "src"),
    ("input", "src"),
    ("image", "href"),
    ("use", "href"),
}
# <link rel=...> values that fetch (or open a connection) when the page loads
_FETCHING_LINKS = {
    "stylesheet", "icon", "shortcut", "apple-touch-icon", "preload", "prefetch", "preconnect",
    "dns-prefetch", "modulepreload", "manifest", "mask-icon",
}


class _AssetFinder(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, str | None]]) -> None:
        values: Dict[str, str] = {k: v or "" for k, v in attrs}
        if tag == "link":
            rels = set(values.get("rel", "").lower().split())
            if rels & _FETCHING_LINKS and _EXTERNAL.match(values.get("href", "")):
                self.found.append(f'<link rel="{values.get("rel")}" href="{values["href"]}">')
        for attr, value in values.items():
            if (tag, attr) in _FETCHED and _EXTERNAL.match(value):
                self.found.append(f'<{tag} {attr}="{value}">')
            if attr == "style" and re.search(r"url\(\s*['\"]?\s*(https?:)?//", value):
                self.found.append(f'<{tag} style="{value}">')
        if "mermaid" in values.get("class", "").split():
            self.found.append(f'<{tag} class="mermaid"> (the theme loads Mermaid from a CDN)')
        if values.get("data-md-component") == "source":
            self.found.append(
                '<... data-md-component="source"> (the theme asks the code host API for facts)'
            )


def test_the_site_loads_nothing_from_the_network(site: Path) -> None:
    problems = []
    for name, text in _pages(site):
        finder = _AssetFinder()
        finder.feed(text)
        problems += [f"{name}: {item}" for item in finder.found]
        for match in re.finditer(r"<style[^>]*>(.*?)</style>", text, re.DOTALL):
            if re.search(r"(url\(|@import)\s*['\"]?\s*(https?:)?//", match.group(1)):
                problems.append(f"{name}: an inline <style> imports from the network")
    for css in sorted(site.rglob("*.css")):
        text = css.read_text(encoding="utf-8", errors="replace")
        for match in re.finditer(r"(url\(|@import)\s*['\"]?\s*((?:https?:)?//[^'\")\s]+)", text):
            problems.append(f"{css.relative_to(site).as_posix()}: {match.group(2)}")
    assert not problems, "the built site fetches from the network:\n" + "\n".join(problems)


def test_diagrams_are_static_files_of_the_site(site: Path) -> None:
    for name in _load_generator().render_all():
        assert (site / "img" / name).exists(), f"img/{name} is missing from the built site"


def test_the_header_shows_the_logo_the_version_and_the_repository(site: Path) -> None:
    index = (site / "index.html").read_text(encoding="utf-8")
    version = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(),
                        re.MULTILINE)
    assert version is not None
    assert 'src="img/logo.svg"' in index, "no logo in the header"
    assert f'md-source__fact--version">{version.group(1)}<' in index, "no version in the header"
    assert re.search(r'<a href="https?://[^"]+" title="[^"]*" class="md-source"', index), (
        "no repository link in the header"
    )


def test_navigation_labels_do_not_repeat(site: Path) -> None:
    # A section whose first entry has the section's own title ("Porting guides > Porting
    # guides").  Read on the 404 page, where no entry is the current page (the current page's
    # label is written twice, for the table-of-contents toggle).
    nav = re.search(r'<nav class="md-nav md-nav--primary".*?</nav>\s*</div>',
                    (site / "404.html").read_text(encoding="utf-8"), re.DOTALL)
    assert nav is not None
    labels = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", m)).strip()
              for m in re.findall(r'<span class="md-ellipsis">(.*?)</span>', nav.group(0),
                                  re.DOTALL)]
    repeats = [a for a, b in zip(labels, labels[1:]) if a and a == b]
    assert not repeats, f"navigation labels repeat: {repeats}"


# ------------------------------------------------------------------------------- API reference

ROLES = re.compile(r":(func|meth|class|attr|mod|data|exc):")


def test_the_api_reference_has_no_raw_sphinx_roles(site: Path) -> None:
    found = []
    for name, text in _pages(site):
        plain = re.sub(r"<[^>]+>", "", text)
        found += [f"{name}: ...{plain[max(0, m.start() - 40):m.end() + 30]!r}..."
                  for m in ROLES.finditer(plain)]
    assert not found, f"{len(found)} raw Sphinx roles in the built site:\n" + "\n".join(found[:40])


def test_every_public_name_is_in_the_api_reference(site: Path) -> None:
    anchors = set()
    words = set()
    for name, text in _pages(site):
        if name.startswith("api/"):
            anchors.update(re.findall(r'id="([A-Za-z_][\w.]*)"', text))
            words.update(re.findall(r"[A-Za-z_]\w*", re.sub(r"<[^>]+>", " ", text)))
    missing = []
    for public, paths in docs_api.public_names_and_paths():
        shown = any(path in anchors for path in paths)
        # an alias (HandleInfo = Handle) must at least be named where its target is shown
        alias = public.rsplit(".", 1)[1]
        if shown and public not in anchors and alias not in words:
            shown = False
        if not shown:
            missing.append(public)
    assert not missing, f"public names that no API page shows: {missing}"


def test_every_public_name_and_parameter_is_documented() -> None:
    pytest.importorskip("griffe", reason="griffe (mkdocstrings' reader) comes with the docs extra")
    problems = docs_api.undocumented()
    assert not problems, (
        f"{len(problems)} undocumented public names or parameters:\n" + "\n".join(problems)
    )


def test_the_documentation_checker_finds_what_it_should() -> None:
    """The checker behind the test above, on a small module: it must not pass by accident."""
    griffe = pytest.importorskip("griffe", reason="griffe comes with the docs extra")
    code = '''
from dataclasses import dataclass


class Widget:
    """A widget.

    Args:
        size: its size.
        *parts: its parts.

    Attributes:
        area: its area.
    """

    def __init__(self, size, *parts):
        self.area = size * size
        self.colour = None

    def grow(self, by, *, times=1):
        """Grow it.

        Args:
            by: how much.
        """


def make(size, **options):
    """Make a widget.

    Args:
        size: its size.
        **options: anything else.
    """


def bare(x):
    pass


class Mixin:
    def paint(self, colour):
        """Paint it.

        Args:
            colour: the colour.
        """

    def fold(self, times):
        """Fold it."""


class Sheet(Mixin):
    """A sheet."""


@dataclass
class Point:
    """A point.

    Attributes:
        x: across.
    """

    x: int
    y: int
'''
    # a package, not a module: griffe generates a dataclass's __init__ once a package is loaded
    with griffe.temporary_visited_package("m", {"__init__.py": code},
                                          docstring_parser="google") as module:
        problems: List[str] = []
        docs_api._check_class("m.Widget", module["Widget"], problems)
        docs_api._check_function("m.make", module["make"], problems)
        docs_api._check_function("m.bare", module["bare"], problems)
        docs_api._check_class("m.Point", module["Point"], problems)
        docs_api._check_class("m.Sheet", module["Sheet"], problems)
    assert problems == [
        "m.Widget.colour: attribute neither documented nor in Attributes:",
        "m.Widget.grow: parameter 'times' is not in the Args: section",
        "m.bare: no docstring",
        # a dataclass field documented as an attribute documents its __init__ parameter
        "m.Point.__init__: parameter 'y' is not in the Args: section",
        "m.Point.y: attribute neither documented nor in Attributes:",
        # inherited methods are checked too (exitsafe's Registry is made of mixins)
        "m.Sheet.fold: parameter 'times' is not in the Args: section",
    ]


#: The widest code line that fits the text column (tests/test_docs.py, MAX_LINE).
MAX_CODE_LINE = 88


def _docstring_examples() -> Iterator[Tuple[str, str]]:
    """``(where, code)`` of every fenced Python block in a docstring of the public modules."""
    import ast
    import textwrap

    fence = re.compile(r"^([ \t]*)```python\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
    for path in sorted((ROOT / "src" / "exitsafe").rglob("*.py")):
        if "lab" in path.relative_to(ROOT / "src" / "exitsafe").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                continue
            doc = ast.get_docstring(node)
            for match in fence.finditer(doc or ""):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}"
                yield where, textwrap.dedent(match.group(2))


def test_api_examples_are_python_that_fits_the_column() -> None:
    examples = list(_docstring_examples())
    assert len(examples) >= 20, "the API reference lost its examples"
    problems = []
    for where, code in examples:
        try:
            compile(code, where, "exec")
        except SyntaxError as exc:
            problems.append(f"{where}: {exc}")
        problems += [f"{where}: a line of {len(line)} characters"
                     for line in code.splitlines() if len(line) > MAX_CODE_LINE]
    assert not problems, "docstring examples that do not compile or do not fit:\n" + "\n".join(
        problems
    )


def test_program_output_wraps_inside_the_column(site: Path) -> None:
    """Console and text blocks (program output: FATAL lines, leak reports, traces) carry a
    language class, and the site's stylesheet wraps them, so no line hides behind a
    scrollbar; code lines are kept short by tests/test_docs.py instead."""
    page = (site / "quickstart" / "index.html").read_text(encoding="utf-8")
    assert 'class="language-console highlight"' in page, (
        "console blocks have no language class: pymdownx.highlight needs pygments_lang_class"
    )
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    rule = re.search(r"\.language-console[^{]* pre > code[^{]*\{([^}]*)\}", css)
    assert rule and "pre-wrap" in rule.group(1), "extra.css does not wrap console output"


def test_the_recommended_path_is_on_the_home_page_and_the_quick_start(site: Path) -> None:
    """The home page names the recommended calls and shows an excerpt of the complete
    binding; the quick start shows the complete binding, before and after, cffi and ctypes."""
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "The recommended path for binding authors" in home
    for call in ("exitsafe.cffi.pin", "exitsafe.cffi.track", "exitsafe.cffi.callback",
                 "exitsafe.on_teardown"):
        assert call in home, f"the home page does not name {call}"
    assert "docs/examples/binding/cffi_after.py" in home
    quick = (site / "quickstart" / "index.html").read_text(encoding="utf-8")
    for name in ("cffi_before", "cffi_after", "ctypes_before", "ctypes_after"):
        assert f"docs/examples/binding/{name}.py" in quick, f"the quick start lacks {name}"


# ------------------------------------------------------------ the reference renders cleanly
#
# Each checker reads one built page and returns its problems; each is also run on a small
# page that has the fault (test_the_rendering_checkers_find_what_they_should), so that none
# passes by accident.


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))).strip()


def _section_rows(page: str, title: str) -> Iterator[List[Tuple[str, str]]]:
    """The rows ``(type, description)`` of every ``Returns:``-like table of a page."""
    pattern = (r'<span class="doc-section-title">' + re.escape(title)
               + r"</span></p>\s*<table>(.*?)</table>")
    for table in re.finditer(pattern, page, re.DOTALL):
        rows = []
        for row in re.findall(r'<tr class="doc-section-item">(.*?)</tr>', table.group(1),
                              re.DOTALL):
            cells = [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)]
            if cells:
                rows.append((cells[0], cells[-1]))
        yield rows


def split_return_rows(page: str) -> List[str]:
    """Returns/Yields tables cut mid-sentence into rows repeating the type: Google style
    starts a new returned value at each line of the section's indentation, so a
    description's continuation lines must be indented further."""
    problems = []
    for title in ("Returns:", "Yields:", "Receives:"):
        for rows in _section_rows(page, title):
            if len(rows) < 2:
                continue
            types = [t for t, _ in rows]
            continuation = [d for _, d in rows[1:] if d[:1].islower()]
            unfinished = [d for _, d in rows[:-1] if d and d[-1] not in ".)!?:"]
            if len(set(types)) < len(types) or continuation or unfinished:
                problems.append(f"{title} split into {len(rows)} rows: "
                                + " | ".join(d for _, d in rows)[:160])
    return problems


#: a repository path in text: a page of docs/ must be a link, and the reference names no
#: file of the repository at all (a reader of the site has no checkout)
_PAGE_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")
_REPO_PATH = re.compile(r"\b(?:docs|tests|benchmarks)/[\w./-]+|\bsrc/exitsafe\b[\w./-]*")


def repository_paths(name: str, page: str) -> List[str]:
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", page, flags=re.DOTALL)
    if not name.startswith("api/"):  # a command in a code block may name a file
        body = re.sub(r"<pre[^>]*>.*?</pre>", " ", body, flags=re.DOTALL)
    text = _text(body)
    pattern = _REPO_PATH if name.startswith("api/") else _PAGE_PATH
    return [f"...{text[max(0, m.start() - 40):m.end()]}" for m in pattern.finditer(text)]


def private_names(page: str) -> List[str]:
    """Private names shown in the reference: a heading of a ``_name`` (a private method or
    attribute of a public class), or a private base class in a ``Bases:`` line."""
    problems = [f"heading {ident}" for ident in
                re.findall(r'<h\d id="([\w.]+)" class="doc doc-heading"', page)
                if any(part.startswith("_") for part in ident.split("."))]
    for bases in re.findall(r'<p class="doc doc-class-bases">(.*?)</p>', page, re.DOTALL):
        shown = [n.strip() for n in _text(bases).replace("Bases:", "").split(",")]
        titles = [t.split()[0] for t in re.findall(r'title="\s*([^"]+)"', bases)]
        problems += [f"base {n}" for n in shown if n.startswith("_")]
        problems += [f"base {t}" for t in titles
                     if any(part.startswith("_") for part in t.split("."))]
    return problems


def test_returns_tables_have_one_row_per_returned_value(site: Path) -> None:
    problems = [f"{name}: {p}" for name, text in _pages(site) if name.startswith("api/")
                for p in split_return_rows(text)]
    assert not problems, (
        f"{len(problems)} Returns tables split mid-sentence (indent the continuation lines "
        "of the docstring's Returns: section):\n" + "\n".join(problems)
    )


def test_rendered_text_names_no_repository_path(site: Path) -> None:
    problems = [f"{name}: {p}" for name, text in _pages(site)
                for p in repository_paths(name, text)]
    assert not problems, (
        "repository paths in the rendered pages (link the page instead, "
        "[adapters](../adapters.md) in a docstring):\n" + "\n".join(problems)
    )


def test_public_classes_show_no_private_names(site: Path) -> None:
    problems = [f"{name}: {p}" for name, text in _pages(site) if name.startswith("api/")
                for p in private_names(text)]
    assert not problems, (
        "private names in the API reference (show_bases: false, or a filter):\n"
        + "\n".join(problems)
    )


def test_the_registry_page_opens_with_track_and_shows_every_member(site: Path) -> None:
    """docs/api/handles.md lists Registry's members by hand (what a binding calls first):
    the list must follow the class."""
    pytest.importorskip("griffe", reason="griffe comes with the docs extra")
    page = (site / "api" / "handles" / "index.html").read_text(encoding="utf-8")
    shown = re.findall(r'<h\d id="exitsafe\.Registry\.(\w+)"', page)
    assert shown[:1] == ["track"], f"the Registry page opens with {shown[:3]}"
    registry = docs_api._lookup("exitsafe._registry.Registry")
    public = {name for name in registry.all_members if not name.startswith("_")}
    assert public - set(shown) == set(), (
        f"Registry members missing from docs/api/handles.md: {sorted(public - set(shown))}"
    )


def test_identifiers_in_tables_are_not_cut(site: Path) -> None:
    """The theme lets code break anywhere (word-break: break-word), which cuts an identifier
    in a narrow table column; the site's stylesheet keeps code in tables whole."""
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    rule = re.search(r"\.md-typeset table[^{]*\bcode\s*\{([^}]*)\}", css)
    assert rule and re.search(r"word-break:\s*normal", rule.group(1)), (
        "extra.css does not keep code in tables from breaking mid-identifier"
    )
    threads = (site / "threads" / "index.html").read_text(encoding="utf-8")
    assert "<code>exitsafe.on_early_exit(fn)</code>" in threads


def test_the_rendering_checkers_find_what_they_should() -> None:
    def returns(*rows: Tuple[str, str]) -> str:
        cells = "".join(f'<tr class="doc-section-item"><td><code>{t}</code></td>'
                        f"<td><p>{d}</p></td></tr>" for t, d in rows)
        return ('<p><span class="doc-section-title">Returns:</span></p>\n<table><thead>'
                f"</thead><tbody>{cells}</tbody></table>")

    split = returns(("Handle", "A handle holding one owner: its"),
                    ("Handle", "raw raises once released."))
    assert len(split_return_rows(split)) == 1
    assert split_return_rows(returns(("Handle", "A handle."))) == []
    assert split_return_rows(returns(("int", "The count."), ("str", "The name."))) == []
    assert repository_paths("api/cffi/index.html", "<p>See docs/adapters.md for why.</p>")
    assert repository_paths("cookbook/index.html", "<p>See docs/adapters.md.</p>")
    assert not repository_paths(
        "cookbook/index.html", '<p>See <a href="../adapters/">adapters</a>.</p>'
        "<pre><code>python docs/examples/x.py</code></pre>")
    assert private_names('<h3 id="exitsafe.Registry._finish" class="doc doc-heading">')
    assert private_names('<p class="doc doc-class-bases">Bases: <code><span title='
                         '"exitsafe._registry._Facade">_Facade</span></code></p>')
    assert not private_names('<p class="doc doc-class-bases">Bases: <code><a title="  '
                             'exitsafe.ExitsafeError (exitsafe._errors.ExitsafeError)">'
                             "ExitsafeError</a></code></p>")


#: The most words the quick start may ask a reader to read (what is folded away aside).
QUICK_START_WORDS = 1500


def test_the_quick_start_is_short_and_folds_the_trace(site: Path) -> None:
    """The quick start reaches its clean exit in under QUICK_START_WORDS words, counted as the
    page's text outside its folded blocks (``??? note``: pymdownx.details), code included; the
    teardown trace is there, folded."""
    page = (site / "quickstart" / "index.html").read_text(encoding="utf-8")
    article = re.search(r"<article[^>]*>(.*?)</article>", page, re.DOTALL)
    assert article is not None
    unfolded = re.sub(r"<details.*?</details>", " ", article.group(1), flags=re.DOTALL)
    words = len(_text(unfolded).split())
    assert words < QUICK_START_WORDS, f"the quick start asks for {words} words of reading"
    assert "exitsafe: step " not in _text(unfolded), "trace lines outside a folded block"
    assert "exitsafe: step " in _text(article.group(1)), "the quick start lost its trace"
    clean = _text(unfolded).find("teardown=unload logger=0")
    assert clean != -1, "the quick start does not reach a clean exit outside a folded block"
