"""MkDocs hook: the site's front page is the README. Its links into docs/ are written for
GitHub (`docs/algorithms.md`); on the site the same pages sit one folder up, so the front page
drops the `docs/` prefix. docs/index.md only holds a comment that says so."""

import re
from pathlib import Path

DOCS_LINK = re.compile(r"\]\(docs/")


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "index.md":
        return markdown
    readme = Path(config.config_file_path).parent / "README.md"
    return DOCS_LINK.sub("](", readme.read_text(encoding="utf-8"))
