"""Facts about rlcli's import graph, read from the source with `ast` (nothing is imported).

    python scripts/import_graph.py            # report; exit 1 if a rule is broken
    python scripts/import_graph.py --quiet    # only the broken rules

Rules (docs/ARCHITECTURE.md): no import circle between modules; no module imports one of a
higher layer (LAYERS below, lowest first: a module belongs to the first prefix it matches);
no module longer than MAX_LINES; no function longer than MAX_FUNCTION_LINES in the
orchestration rooms (SHORT_ROOMS). Every import counts, also one inside a function: a lazy
import hides a cycle from Python, not from a reader.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rlcli"
MAX_LINES = 400
# The orchestration rooms read top to bottom: no function there longer than this.
MAX_FUNCTION_LINES, SHORT_ROOMS = 60, ("rlcli.train", "rlcli.collect", "rlcli.rollout")

# Lowest first. A module may import from its own layer and the layers before it.
LAYERS: list[tuple[str, list[str]]] = [
    ("schema and math", ["rlcli.config.schema", "rlcli.config", "rlcli.ops"]),
    ("runtime", ["rlcli.runtime"]),
    ("env", ["rlcli.env"]),
    ("data", ["rlcli.data"]),
    ("rollout", ["rlcli.rollout"]),
    ("rewards", ["rlcli.rewards"]),
    ("collect", ["rlcli.collect"]),
    ("tracking", ["rlcli.tracking"]),
    ("lifecycle", ["rlcli.lifecycle"]),
    ("train", ["rlcli.train"]),
    ("launch", ["rlcli.launch"]),
    ("validation", ["rlcli.validate"]),
    ("commands", ["rlcli.commands"]),
    ("entry", ["rlcli.cli", "rlcli.__main__", "rlcli"]),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The rlcli modules `path` imports (`from rlcli.x import y` counts rlcli.x.y when that
    is a module, else rlcli.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("rlcli")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not node.module.startswith("rlcli"):
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return {m for m in found if m in modules}


def layer_of(module: str) -> int:
    best, best_len = len(LAYERS), -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    modules = set(files)
    graph = {m: imports_of(p, modules) - {m} for m, p in files.items()}
    # A package's __init__ is imported by its submodules implicitly; that is not an edge.
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    lines = {m: len(p.read_text().splitlines()) for m, p in files.items()}

    circles = cycles(graph)
    upward = sorted((m, d) for m, deps in graph.items() for d in deps if layer_of(d) > layer_of(m))
    unplaced = sorted(m for m in modules if layer_of(m) == len(LAYERS))
    long = sorted((n, m) for m, n in lines.items() if n > MAX_LINES)
    top = sorted(p for p in PACKAGE.glob("*.py"))
    long_functions = sorted(
        (n.end_lineno - n.lineno + 1, f"{m}.{n.name}")
        for m, p in files.items()
        if m.startswith(SHORT_ROOMS)
        for n in ast.walk(ast.parse(p.read_text()))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    )

    if not args.quiet:
        edges = sum(len(d) for d in graph.values())
        print(f"{len(modules)} modules, {edges} imports between them, {len(top)} at the top of "
              f"rlcli/, largest {max(lines.values())} lines")  # fmt: skip
        for name, prefixes in LAYERS:
            members = sorted(m for m in modules if LAYERS[layer_of(m)][0] == name)
            print(f"  {name}: {len(members)} modules ({', '.join(prefixes)})")
    print(f"import circles: {len(circles)}")
    for c in circles:
        print(f"  {len(c)} modules: {', '.join(c)}")
    print(f"imports from a lower layer to a higher one: {len(upward)}")
    for m, d in upward:
        print(f"  {m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})")
    print(f"modules in no layer: {len(unplaced)}" + (f" ({', '.join(unplaced)})" * bool(unplaced)))
    print(f"modules over {MAX_LINES} lines: {len(long)}")
    for n, m in long:
        print(f"  {m}: {n}")
    rooms = ", ".join(r.split(".")[1] + "/" for r in SHORT_ROOMS)
    print(f"functions over {MAX_FUNCTION_LINES} lines in {rooms}: {len(long_functions)}")
    for n, f in long_functions:
        print(f"  {f}: {n}")
    return 1 if circles or upward or unplaced or long or long_functions else 0


if __name__ == "__main__":
    sys.exit(main())
