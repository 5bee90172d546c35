"""MkDocs hook: formulas set on their own line stay out of the search index, so a search
result quotes the page's words, not a formula's LaTeX source. (Material's search plugin skips
any element marked `data-search-exclude`; it reads the page after this hook.)"""

DISPLAY_FORMULA = '<div class="arithmatex">'


def on_page_content(html, page, config, files):
    return html.replace(DISPLAY_FORMULA, '<div class="arithmatex" data-search-exclude>')
