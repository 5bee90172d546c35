"""The documentation site (mkdocs.yml, docs/) builds with warnings as errors (every link, anchor
and included file resolves), its navigation lists every page, its formulas typeset with the
KaTeX it ships, and the generated parts still match what they describe."""

import html
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

DOCS = REPO / "docs"


def nav_pages(nav) -> list[str]:
    """The Markdown files a mkdocs nav names, in order."""
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_site_builds_with_warnings_as_errors(site):
    front = (site / "index.html").read_text()
    assert "What you do with it" in front  # the README is the front page
    assert 'href="algorithms/"' in front  # its docs/ links, pointed at the site's pages
    assert (site / "search" / "search_index.json").is_file()
    assert (site / "assets" / "katex" / "katex.min.js").is_file()


def test_the_nav_lists_every_page_and_only_pages_that_exist():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
    assert sorted(listed) == on_disk
    assert len(listed) == len(set(listed))


def formulas(site: Path) -> list[str]:
    """Every formula of the built pages, as arithmatex leaves it for the browser."""
    found = []
    for page in site.rglob("*.html"):
        text = page.read_text()
        for source in re.findall(r'class="arithmatex">(.*?)</(?:span|div)>', text, re.S):
            found.append(html.unescape(source).strip()[2:-2])
    return found


@pytest.mark.skipif(shutil.which("node") is None, reason="node runs the shipped KaTeX")
def test_every_formula_typesets_with_the_shipped_katex(site, tmp_path):
    sources = formulas(site)
    assert len(sources) > 50  # the algorithms page alone has dozens
    (tmp_path / "formulas.json").write_text(json.dumps(sources))
    script = """
    const katex = require(process.argv[1]);
    const failed = [];
    for (const tex of require(process.argv[2])) {
      try { katex.renderToString(tex, {throwOnError: true}); }
      catch (err) { failed.push(tex + "  <-  " + err.message); }
    }
    console.log(JSON.stringify(failed));
    """
    katex = site / "assets" / "katex" / "katex.min.js"
    ran = subprocess.run(["node", "-e", script, str(katex), str(tmp_path / "formulas.json")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == []


@pytest.fixture(scope="module")
def bad_input():
    """scripts/bad_input.py as a module (tests/cli/test_bad_input.py loads it the same way)."""
    if "bad_input" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "bad_input", REPO / "scripts" / "bad_input.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["bad_input"] = module
        spec.loader.exec_module(module)
    return sys.modules["bad_input"]


def test_the_reliability_table_lists_every_bad_input_and_fault(bad_input):
    page = (DOCS / "reliability.md").read_text()
    region = page.split(bad_input.TABLE_BEGIN)[1].split(bad_input.TABLE_END)[0]
    missing = [c.name for c in bad_input.BAD_INPUTS if f"| {c.name} (`" not in region]
    missing += [
        f.__name__ for f in bad_input.FAULTS if bad_input.describe_fault(f)[0] not in region
    ]
    assert not missing, f"run scripts/bad_input.py to refresh docs/reliability.md: {missing}"


def test_bad_input_writes_only_its_region(bad_input, tmp_path):
    page = tmp_path / "page.md"
    begin, end = bad_input.TABLE_BEGIN, bad_input.TABLE_END
    page.write_text(f"# Title\n\nbefore\n{begin}\nold table\n{end}\nafter\n")
    bad_input.write_table(page, "new table")
    assert page.read_text() == f"# Title\n\nbefore\n{begin}\nnew table\n{end}\nafter\n"
    page.write_text("# a page without the region\n")
    with pytest.raises(SystemExit, match="no table region"):
        bad_input.write_table(page, "new table")


def test_every_name_of_the_python_api_table_exists():
    section = (DOCS / "ARCHITECTURE.md").read_text().split("## The pieces from Python")[1]
    absent = []
    for row in section.splitlines():
        cells = row.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`rlcli"):
            continue
        modules = [importlib.import_module(m) for m in re.findall(r"`([\w.]+)`", cells[1])]
        for name in re.findall(r"`(\w+)`", cells[2]):
            if not any(hasattr(module, name) for module in modules):
                absent.append(name)
    assert not absent
