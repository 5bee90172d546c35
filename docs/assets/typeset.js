// Formulas: pymdownx.arithmatex (generic mode) leaves each one as text in an element of class
// "arithmatex": \( ... \) inline in a span, \[ ... \] on its own in a div. Each is typeset here
// with the KaTeX copy in assets/katex, so the site needs no network. Material calls document$
// on every page it shows, including pages reached through its instant navigation.
function typesetFormulas(root) {
  for (const element of root.querySelectorAll(".arithmatex")) {
    if (element.dataset.typeset) continue;
    const source = element.textContent.trim();
    katex.render(source.slice(2, -2), element, {
      displayMode: element.tagName === "DIV",
      throwOnError: false,
    });
    element.dataset.typeset = "yes";
  }
}

document$.subscribe(({ body }) => typesetFormulas(body));
