"""Where the config goes: a walk of `cfg` from `rlcli.train.loop.train`, read with `ast`.

    python scripts/cfg_walk.py [--quiet | --json]   # counts, the first 105 stays, the list

A measurement: nothing of rlcli is imported, and the exit status is 0. Definitions:

- The walk starts in `rlcli.train.loop.train`, whose `cfg` holds the whole Config.
- A function *holds* names bound to config paths: () the whole Config, a section (a schema
  dataclass: `cfg.sampler`, `cfg.model.lora`), else a leaf value. Held are the parameters handed
  some, names assigned a held name or an attribute path of one (`t = cfg.trainer`), and objects
  carrying one in a field or an item: `run = Run(cfg=cfg)` holds it as `run.cfg`, as does
  `run = setup(cfg)` when `setup` returns such an object.
- A *stay* is a function the config reaches: depth first, each once (first visit wins). Calls
  run in evaluation order (by where each ends); one is followed when an argument is held or
  carries something held (also inside a tuple or rlcli dataclass built there), and the callee's
  parameter then holds that. Callees: from-imports, nested functions, `mod.func`, `Class(...)`
  (its __init__), `Class.method`, `x.method()` where x is `self` or annotated with, built from
  or an item of (`NAME: dict[str, Class]`) a rlcli class, and dataclass fields holding functions
  (`trainer.setup(cfg)`: each function passed as `setup=` to a `Trainer(...)`). Not followed:
  library calls, registries, lambdas, `self.x` attributes, and stays holding leaf values alone.
- A stay's *room* is its module's layer in scripts/import_graph.py's LAYERS (lowest first).
- *Enters N rooms*: the distinct rooms among the first 105 stays (their modules also counted).
- *Climbs back up*: the consecutive pairs among them whose second room is a higher layer.
- *A lower room takes the whole Config*: a followed call (a first visit or not) hands the whole
  Config, itself or in a field, to a function outside the train/validation/commands/entry rooms
  and outside the module that defines Config (`config_dict`, its conversion to plain data).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from functools import reduce
from itertools import takewhile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ("rlcli.train.loop", "train", "cfg")
WINDOW = 105
UPPER_ROOMS = {"train", "validation", "commands", "entry"}  # rooms the whole Config may enter
# The module that defines Config: its own converters (`config_dict`) read the whole of it.
SCHEMA = "rlcli.config.schema"
STRENGTH = {"leaf": 0, "section": 1, "whole": 2}

# One layer table for both scripts: import_graph.py's, imported from its file, not copied.
sys.path.insert(0, str(ROOT / "scripts"))
from import_graph import LAYERS, layer_of  # noqa: E402


def dotted(expr: ast.expr) -> str | None:
    """`cfg.trainer.lr` -> "cfg.trainer.lr"; None for anything but names and attributes."""
    if isinstance(expr, ast.Attribute) and (base := dotted(expr.value)) is not None:
        return f"{base}.{expr.attr}"
    return expr.id if isinstance(expr, ast.Name) else None


def arguments(names: list[str], call: ast.Call) -> list[tuple[str, ast.expr]]:
    """(name, value) for a call's positional arguments up to a *starred one, and keywords."""
    given = zip(names, call.args, strict=False)
    positional = takewhile(lambda pair: not isinstance(pair[1], ast.Starred), given)
    return [*positional, *((k.arg, k.value) for k in call.keywords if k.arg)]


class Index:
    """The package's modules, functions ("module:Qual.name"), classes and module scopes."""

    def __init__(self, package: Path):
        self.root, self.files, self.functions, self.classes, trees = package.parent, {}, {}, {}, {}
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self.files[module], trees[module] = path, ast.parse(path.read_text(), str(path))
            self._add(trees[module].body, module, "", None)
        # Name -> "pkg.mod:name", a module or not (chase tells). rlcli imports its own modules
        # with `from` alone; one inside a function counts for the module, as in import_graph.
        self.scopes = {m: {a.asname or a.name: f"{n.module}:{a.name}" for n in ast.walk(t)
                           if isinstance(n, ast.ImportFrom) and n.level == 0 for a in n.names}
                       | {n.name: f"{m}:{n.name}" for n in t.body if hasattr(n, "name")}
                       for m, t in trees.items()}  # fmt: skip
        # (class, field) -> functions; module -> {"NAME" or "NAME[]" (its items): class}
        self.impls, self.var_types = {}, {}
        for module, tree in trees.items():
            scope, types = self.scopes[module], self.var_types.setdefault(module, {})
            for node in (n for n in tree.body if isinstance(n, ast.AnnAssign)):
                ann, items = node.annotation, isinstance(node.annotation, ast.Subscript)
                if items:  # dict[str, Class] or list[Class]: its items are Class
                    ann = ann.slice.elts[-1] if isinstance(ann.slice, ast.Tuple) else ann.slice
                if (cls := self.class_of(ann, scope)) and isinstance(node.target, ast.Name):
                    types[node.target.id + "[]" * items] = cls
            # A dataclass field holding a function: every function passed as it, in order.
            for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
                if cls := self.class_of(call.func, scope):
                    for name, value in arguments(self.fields(cls), call):
                        if (fn := self.resolve(value, scope)) in self.functions:
                            found = self.impls.setdefault((cls, name), [])
                            found += [fn] * (fn not in found)
        schema = trees.get(f"{package.name}.config.schema", ast.Module(body=[]))
        self.schema = {c.name: {s.target.id: getattr(s.annotation, "id", None) for s in c.body
                                if isinstance(s, ast.AnnAssign)}
                       for c in schema.body if isinstance(c, ast.ClassDef)}  # fmt: skip

    def _add(self, body: list[ast.stmt], module: str, prefix: str, cls: str | None) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef):
                self.functions[f"{module}:{prefix}{node.name}"] = (module, node, cls)
                self._add(node.body, module, f"{prefix}{node.name}.", None)
            elif isinstance(node, ast.ClassDef) and not prefix:
                self.classes[f"{module}:{node.name}"] = node
                self._add(node.body, module, f"{node.name}.", f"{module}:{node.name}")

    def chase(self, target: str | None, hops: int = 0) -> str | None:
        """The module, function or class `target` ends at, through re-exports."""
        if target in self.files or target in self.functions or target in self.classes:
            return target
        module, _, name = (target or "").partition(":")
        if f"{module}.{name}" in self.files:  # `from pkg import mod`
            return f"{module}.{name}"
        further = self.scopes.get(module, {}).get(name)
        return self.chase(further, hops + 1) if further != target and hops < 20 else None

    def resolve(self, expr: ast.expr, scope: dict[str, str]) -> str | None:
        if isinstance(expr, ast.Name):
            return self.chase(scope.get(expr.id))
        if not isinstance(expr, ast.Attribute) or not (owner := self.resolve(expr.value, scope)):
            return None
        if owner in self.classes:
            return self.method(owner, expr.attr)
        # A module's attribute: a submodule, or a name defined or imported there.
        return self.chase(f"{owner}:{expr.attr}") if owner in self.files else None

    def class_of(self, expr: ast.expr, scope: dict) -> str | None:
        """The rlcli class an expression or annotation names (`Trainer`, `rl.Run`), else None."""
        return found if (found := self.resolve(expr, scope)) in self.classes else None

    def bases(self, cls: str) -> list[str]:
        scope = self.scopes[cls.partition(":")[0]]
        return [b for e in self.classes[cls].bases if (b := self.class_of(e, scope))]

    def method(self, cls: str, name: str) -> str | None:
        if f"{cls}.{name}" in self.functions:
            return f"{cls}.{name}"
        return next((m for b in self.bases(cls) if (m := self.method(b, name))), None)

    def fields(self, cls: str) -> list[str]:
        """A dataclass's fields in order, inherited ones first."""
        own = [s.target.id for s in self.classes[cls].body
               if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]  # fmt: skip
        return [f for b in self.bases(cls) for f in self.fields(b)] + own

    def kind(self, path: tuple[str, ...]) -> str:
        cls = reduce(lambda cls, field: self.schema.get(cls, {}).get(field), path, "Config")
        return "whole" if not path else "section" if cls in self.schema else "leaf"

    def describe(self, key: str) -> dict:
        module, node, _ = self.functions[key]
        room = LAYERS[layer_of(module)][0] if layer_of(module) < len(LAYERS) else "no layer"
        at = f"{self.files[module].relative_to(self.root)}:{node.lineno}"
        return {"function": key.replace(":", "."), "room": room, "module": module, "at": at}


class Walk:
    """The depth-first walk: `stays` in visit order, `whole_below` the lower rooms given it all."""

    def __init__(self, index: Index, entry: tuple[str, str, str] = ENTRY):
        self.index, self.stays, self.whole_below = index, [], {}
        # function -> what it returns of the config; id(followed call) -> what its value carries
        self.returns, self.results = {}, {}
        self.enter(f"{entry[0]}:{entry[1]}", {entry[2]: ()}, None)

    def enter(self, key: str, held: dict[str, tuple], caller: str | None) -> None:
        kind = max((self.index.kind(path) for path in held.values()), key=STRENGTH.get)
        how = [f"{n}={'.'.join(p) or 'cfg'}" for n, p in held.items() if self.index.kind(p) == kind]
        stay = {"n": len(self.stays) + 1, **self.index.describe(key), "holds": kind, "how": how}
        self.stays.append({**stay, "from": caller and caller.replace(":", ".")})
        self.returns[key] = {}  # first visit wins, also while it is being walked
        if kind != "leaf":  # a float or a string carries no config further
            self.visit(key, held)

    def visit(self, key: str, held: dict[str, tuple]) -> None:
        index, (module, node, cls) = self.index, self.index.functions[key]
        scope, types, held = dict(index.scopes[module]), dict(index.var_types[module]), dict(held)
        scope |= {n.name: f"{key}.{n.name}" for n in node.body if isinstance(n, ast.FunctionDef)}
        params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        types |= {params[0].arg: cls} if cls and params else {}  # self: static methods too
        annotated = [(a.arg, a.annotation) for a in params if a.annotation]
        types |= {name: t for name, ann in annotated if (t := index.class_of(ann, scope))}
        # Closures see the function's names: nested functions are walked as part of it. A node
        # is taken where it ends: a call's arguments run before it, a value before its name.
        kinds = (ast.Call, ast.Return, ast.Assign, ast.AnnAssign, ast.NamedExpr)
        steps = [n for n in ast.walk(node) if isinstance(n, kinds)]
        steps.sort(key=lambda n: (n.end_lineno, n.end_col_offset, not isinstance(n, ast.Call)))
        for step in steps:  # a Return of a nested function counts as the function's
            if isinstance(step, ast.Call):
                self.call(key, step, held, scope, types)
            elif isinstance(step, ast.Return) and step.value:
                self.returns[key] |= self.carried(step.value, held, scope)
            elif not isinstance(step, ast.Return) and step.value is not None:
                found = self.carried(step.value, held, scope)
                for target in getattr(step, "targets", [getattr(step, "target", None)]):
                    self.assign(target, step.value, found, held, scope, types)

    def call(self, key: str, call: ast.Call, held: dict, scope: dict, types: dict) -> None:
        for callee, bound_first in self.callees(call, scope, types):
            args = self.index.functions[callee][1].args
            names = [a.arg for a in args.posonlyargs + args.args][int(bound_first) :]
            known = set(names) | {a.arg for a in args.kwonlyargs}
            given = {p + s: path for p, v in arguments(names, call) if p in known
                     for s, path in self.carried(v, held, scope).items()}  # fmt: skip
            if not given:
                continue
            where = self.index.describe(callee)
            if (
                () in given.values()
                and where["room"] not in UPPER_ROOMS
                and not (callee.startswith(SCHEMA + ":"))
            ):
                taken = sorted(p for p, path in given.items() if path == ())
                entry = {**where, "as": taken, "from": key.replace(":", ".")}
                self.whole_below.setdefault(callee, entry)
            if callee not in self.returns:
                self.enter(callee, given, key)
            self.results[id(call)] = self.results.get(id(call), {}) | self.returns[callee]

    def assign(self, target, value, found: dict, held: dict, scope: dict, types: dict) -> None:
        """Bind `target` to what `value` carries (`found`), and to its class where known."""
        if isinstance(target, ast.Name):
            held |= {target.id + sub: path for sub, path in found.items()}
            if isinstance(value, ast.Call) and (cls := self.index.class_of(value.func, scope)):
                types[target.id] = cls
            elif isinstance(value, ast.Subscript) and (item := dotted(value.value)) is not None:
                types |= {target.id: types[item + "[]"]} if item + "[]" in types else {}
        elif isinstance(target, (ast.Tuple, ast.List)):
            pairs = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            for i, item in enumerate(target.elts):
                part = {k[len(f"[{i}]") :]: p for k, p in found.items() if k.startswith(f"[{i}]")}
                self.assign(item, value.elts[i] if pairs else None, part, held, scope, types)

    def carried(self, expr: ast.expr, held: dict, scope: dict) -> dict[str, tuple]:
        """What `expr` carries of the config: {"" (itself), ".field" or "[0]": config path}."""
        if (name := dotted(expr)) is not None:
            for key in sorted(held, key=len, reverse=True):  # the longest held prefix
                if name == key or name.startswith((key + ".", key + "[")):
                    return {"": held[key] + tuple(p for p in name[len(key) :].split(".") if p)}
            inside = (name + ".", name + "[")
            return {k[len(name) :]: p for k, p in held.items() if k.startswith(inside)}
        cls = isinstance(expr, ast.Call) and self.index.class_of(expr.func, scope)
        if isinstance(expr, (ast.Tuple, ast.List)):
            parts = [(f"[{i}]", item) for i, item in enumerate(expr.elts)]
        elif cls:  # a dataclass built: its fields
            parts = [(f".{name}", arg) for name, arg in arguments(self.index.fields(cls), expr)]
        else:  # a call followed: what its functions returned
            return self.results.get(id(expr), {}) if isinstance(expr, ast.Call) else {}
        return {k + s: p for k, item in parts for s, p in self.carried(item, held, scope).items()}

    def callees(self, call: ast.Call, scope: dict, types: dict) -> list[tuple[str, bool]]:
        """(function, whether its first parameter is bound) for each function `call` may run."""
        index, func = self.index, call.func
        if isinstance(func, ast.Attribute) and (cls := types.get(dotted(func.value) or "")):
            if method := index.method(cls, func.attr):
                return [(method, True)]
            return [(f, False) for f in index.impls.get((cls, func.attr), [])]
        target = index.resolve(func, scope)
        if target in index.classes:
            return [(init, True)] if (init := index.method(target, "__init__")) else []
        if target in index.functions:
            return [(target, False)]  # also `Class.method(obj, ...)`
        return []


def counts(walk: Walk, window: int = WINDOW) -> dict:
    first = walk.stays[:window]
    layers = [layer_of(s["module"]) for s in first]
    climbs = sum(b > a for a, b in zip(layers, layers[1:], strict=False))
    rooms, modules = len({s["room"] for s in first}), len({s["module"] for s in first})
    return {"stays": len(walk.stays), "window": len(first), "rooms": rooms, "modules": modules,
            "climbs": climbs}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", action="store_true", help="the counts alone")
    parser.add_argument("--json", action="store_true", help="everything, as JSON")
    args = parser.parse_args()
    walk = Walk(Index(ROOT / "rlcli"))
    found, below = counts(walk), list(walk.whole_below.values())
    if args.json:
        print(json.dumps({**found, "walk": walk.stays, "whole_below": below}, indent=1))
        return 0
    print("walk of cfg from rlcli.train.loop.train: {stays} stays; in the first {window}: {rooms} "
          "rooms ({modules} modules), {climbs} climbs back up; lower-room functions taking the "
          "whole Config: {below}".format(**found, below=len(below)))  # fmt: skip
    if args.quiet:
        return 0
    print(f"\nthe first {found['window']} stays (holds: the strongest it was handed, and how):")
    for s in walk.stays[:WINDOW]:
        how = f"{s['holds']}: {', '.join(s['how'])}"
        print(f"  {s['n']:3}. {s['room']:15} {s['function']} (holds: {how})")
    print("\nfunctions outside train, validation, commands and entry taking the whole Config:")
    for w in below:
        print(f"  {w['function']} ({w['room']}) {w['at']} as {', '.join(w['as'])} from {w['from']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
