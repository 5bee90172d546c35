"""How the built site lays text out where a reader hit a problem: the Configuration reference's
field names are not broken mid-word, and the TRL page's examples (its headline one first) fit
the page.

No browser runs here, so the first is checked on the built page and the stylesheets it links:
their rules are cascaded (specificity, then order) for a field name's <code> and its ancestors,
as a browser would, for the two properties that allow a break inside a word."""

import re

from tests.conftest import REPO

# Both say whether a line may break inside a word; both are inherited. word-wrap is
# overflow-wrap's older name.
PROPERTIES = {"word-break": "word-break", "overflow-wrap": "overflow-wrap",
              "word-wrap": "overflow-wrap"}  # fmt: skip
# The parts of a selector this cascade understands; a selector with any other is taken not to
# match (none of the theme's rules for tables and code needs more).
COMPOUND = re.compile(
    r"(?P<tag>[a-z][a-z0-9]*|\*)?(?P<rest>(?:\.[\w-]+|:first-child|:not\(\[class\]\))*)"
)


def css_rules(text: str) -> list[tuple[str, str]]:
    """(selector list, declarations) of every style rule, those inside @media and @supports
    blocks too (taken to apply: a rule that could win at some width counts)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    rules, i = [], 0
    while (start := text.find("{", i)) != -1:
        prelude = text[i:start].split(";")[-1].lstrip("} \n\t")
        if prelude.startswith(("@media", "@supports", "@layer", "@container")):
            i = start + 1
            continue
        depth, end = 1, start + 1
        while depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        rules.append((prelude.strip(), text[start + 1 : end - 1]))
        i = end
    return rules


def split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def compound_matches(compound: str, element: dict) -> tuple[int, int] | None:
    """(classes and pseudo-classes, tags) of `compound` if it matches `element`, else None."""
    found = COMPOUND.fullmatch(compound)
    if not found:
        return None
    tag, rest = found["tag"], found["rest"]
    if tag not in (None, "*", element["tag"]):
        return None
    parts = re.findall(r"\.[\w-]+|:first-child|:not\(\[class\]\)", rest)
    for part in parts:
        if part.startswith(".") and part[1:] not in element["classes"]:
            return None
        if part == ":first-child" and not element["first"]:
            return None
        if part == ":not([class])" and element["classes"]:
            return None
    return len(parts), int(tag not in (None, "*"))


def specificity(selector: str, chain: list[dict]) -> tuple[int, int] | None:
    """The specificity of a complex selector (descendant and child combinators) if it matches
    the last element of `chain` (its ancestors before it), else None."""
    tokens = re.findall(r">|[^\s>]+", selector)
    if not tokens or tokens[-1] == ">":
        return None
    total, position, child = (0, 0), len(chain), False
    for token in reversed(tokens):
        if token == ">":
            child = True
            continue
        if position == len(chain):  # the selector's subject: the element itself
            candidates = [position - 1]
        else:  # a parent (>) or any ancestor, nearest first
            candidates = [position - 1] if child else range(position - 1, -1, -1)
        matched = [(i, score) for i in candidates if i >= 0
                   if (score := compound_matches(token, chain[i])) is not None]  # fmt: skip
        if not matched:
            return None
        position, score = matched[0]
        total, child = (total[0] + score[0], total[1] + score[1]), False
    return total


def declared(chain: list[dict], sheets: list[str]) -> dict[str, str]:
    """The word-break and overflow-wrap that the rules matching the last element of `chain`
    give it: per property the winning declaration (!important, specificity, then order)."""
    best: dict[str, tuple] = {}
    rules = [rule for sheet in sheets for rule in css_rules(sheet)]
    for order, (selectors, declarations) in enumerate(rules):
        scores = [specificity(one.strip(), chain) for one in split_top(selectors, ",")]
        scores = [score for score in scores if score is not None]
        if not scores:
            continue
        for declaration in declarations.split(";"):
            name, _, value = (part.strip() for part in declaration.partition(":"))
            if name in PROPERTIES:
                key = ("!important" in value, max(scores), order)
                if name not in best or key > best[PROPERTIES[name]][0]:
                    best[PROPERTIES[name]] = (key, value.replace("!important", "").strip())
    return {prop: value for prop, (_, value) in best.items()}


def computed(chain: list[dict], sheets: list[str]) -> dict[str, str]:
    """word-break and overflow-wrap of the last element of `chain`: what its own rules
    declare, else (both are inherited) its nearest ancestor's."""
    values: dict[str, str] = {}
    for depth in range(1, len(chain) + 1):
        values.update(declared(chain[:depth], sheets))
    return values


def element(tag: str, classes=(), first: bool = False) -> dict:
    return {"tag": tag, "classes": set(classes), "first": first}


def field_name_chain(page: str, column_first: bool) -> list[dict]:
    """A table cell's <code> in the page's article, with the wrappers the theme's script puts
    around every table."""
    article = re.search(r'<article class="([^"]*)"', page)[1].split()
    return [
        element("html"), element("body"), element("article", article),
        element("div", ["md-typeset__scrollwrap"]), element("div", ["md-typeset__table"]),
        element("table"), element("tbody"), element("tr", first=True),
        element("td", first=column_first), element("code"),
    ]  # fmt: skip


def test_the_configuration_reference_keeps_field_names_whole(site):
    page_dir = site / "reference" / "configuration"
    page = (page_dir / "index.html").read_text()
    names = re.findall(r"<tr>\s*<td><code>([\w.]+)</code></td>", page)
    assert "trainer.max_steps" in names and len(names) > 200
    links = re.findall(r'<link rel="stylesheet" href="([^"]+)"', page)
    assert links[-1].endswith("assets/extra.css")  # after the theme's, as the cascade assumes
    sheets = [(page_dir / link).resolve().read_text() for link in links]

    first = computed(field_name_chain(page, column_first=True), sheets)
    assert first == {"word-break": "normal", "overflow-wrap": "normal"}, first
    # The theme's own rule for code, which broke them, still holds in the other columns: the
    # cascade above does see it.
    other = computed(field_name_chain(page, column_first=False), sheets)
    assert other == {"word-break": "break-word", "overflow-wrap": "break-word"}, other


def code_blocks(markdown: str) -> list[list[str]]:
    """The lines of each fenced code block of a page."""
    blocks, current, fence = [], None, None
    for line in markdown.splitlines():
        opened = re.match(r"\s*(```+|~~~+)", line)
        if current is None and opened:
            current, fence = [], opened[1]
        elif current is not None and line.strip() == fence:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


# The characters of a code line the pages show without scrolling: the content column beside
# both sidebars on a 1280-pixel-wide screen, in the theme's code font.
CODE_LINE_FITS = 90


def test_the_trl_pages_examples_need_no_scrolling():
    blocks = code_blocks((REPO / "docs" / "from-trl-verl.md").read_text())
    assert ["$ rlcli train num_generations=8"] in [block[:1] for block in blocks]  # the headline
    too_wide = [line for block in blocks for line in block if len(line) > CODE_LINE_FITS]
    assert too_wide == []
