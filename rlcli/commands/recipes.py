"""Paper setups: the YAML files in `recipes/`, the `recipe=NAME` config group, `rlcli recipes`.

A recipe is a config of the package `_global_`: it picks group choices in its defaults list
(`override /algo: dapo`) and sets any field of any group (`trainer.lr: 1.0e-6`); the command line
overrides it. Its name is its path under `recipes/` without `.yaml`:
`recipes/cpu/dapo_qwen32b.yaml` is `recipe=cpu/dapo_qwen32b`. `register_recipes` makes them a Hydra
group; `find_recipes` reads their headers, which `rlcli recipes` lists and scripts/make_docs.py
turns into docs/recipes.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from rlcli.config import Config, ConfigError

# The recipe files (`recipes/` at the top of the repository, next to `conf/`).
RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
# Recipes under this folder are CPU twins: a paper's algorithm shrunk to SmolLM2 on CPU.
CPU_FOLDER = "cpu"
# Recipes under this folder are rlcli's own setups (no paper), each showing a feature on CPU.
DEMO_FOLDER = "demo"

USAGE = """usage: rlcli recipes [NAME]

Lists the paper setups in recipes/ (a name and the first line of its description), or prints
the recipe NAME with its comments. Run one with: rlcli train recipe=NAME [overrides]
"""


@dataclass(frozen=True)
class Recipe:
    """One recipe file and what its header says."""

    name: str  # the choice of `recipe=`, e.g. cpu/dapo_qwen32b
    path: Path
    command: str  # the header's first line, e.g. rlcli train recipe=cpu/dapo_qwen32b
    description: str  # the header's second line

    @property
    def cpu_twin(self) -> bool:
        return self.name.startswith(f"{CPU_FOLDER}/")

    @property
    def demo(self) -> bool:
        return self.name.startswith(f"{DEMO_FOLDER}/")

    @property
    def kind(self) -> int:  # the listing's order: paper setups, CPU twins, demos
        return 2 if self.demo else int(self.cpu_twin)


def read_recipe(path: Path, root: Path = RECIPES_DIR) -> Recipe:
    """The recipe at `path`; its command and description come from its leading comments.
    Every recipe starts with a comment block: the command that runs it, then the first line of
    its description (what `rlcli recipes` prints), then the paper, its result and the
    hardware."""
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    text = [line for line in header if line]
    return Recipe(
        name=path.relative_to(root).with_suffix("").as_posix(),
        path=path,
        command=text[0] if text else "",
        description=text[1] if len(text) > 1 else "",
    )


def find_recipes(root: Path = RECIPES_DIR) -> list[Recipe]:
    """Every recipe under `root` (subfolders too): paper setups, CPU twins, then demos."""
    recipes = [read_recipe(path, root) for path in root.rglob("*.yaml")]
    return sorted(recipes, key=lambda r: (r.kind, r.name))


def register_recipes(root: Path = RECIPES_DIR) -> list[Recipe]:
    """Make `recipe=NAME` a Hydra group choice for every recipe file; return the recipes.

    Hydra looks a group up as a folder named after it on its search path, and the folder here
    is `recipes/` (named for what it holds, next to `conf/`), so each file is stored in Hydra's
    ConfigStore as a choice of the group `recipe`. `conf/config.yaml` lists `- recipe: null`
    after `_self_`, so a recipe overrides the groups' defaults and `rlcli train`'s own, and the
    command line overrides the recipe. A recipe that needs a file shipped next to it names it
    `${recipe_file:data/pretraining_sample.txt}`, which resolves to an absolute path inside
    `recipes/`, so it works from any working directory. Safe to call again: a stored config is
    replaced by the same one.
    """
    from hydra.core.config_store import ConfigStore

    # Files that ship with the recipes are named relative to recipes/, whatever the cwd is.
    OmegaConf.register_new_resolver(
        "recipe_file", lambda relative: str(root / relative), replace=True
    )
    store = ConfigStore.instance()
    recipes = find_recipes(root)
    for recipe in recipes:
        group, _, name = f"recipe/{recipe.name}".rpartition("/")
        node = OmegaConf.load(recipe.path)
        store.store(name=name, node=node, group=group, package="_global_", provider="rlcli")
    return recipes


def check_recipe_choices(overrides: Sequence[str], root: Path = RECIPES_DIR) -> None:
    """Raise ConfigError naming the valid recipes when `overrides` picks one that is not."""
    names = [r.name for r in find_recipes(root)]
    for override in overrides:
        key, sign, value = override.partition("=")
        if not sign or key.lstrip("+") != "recipe" or value in ("", "null"):
            continue
        # A sweep (-m) lists choices with commas; other sweep syntax is left to Hydra.
        chosen = [] if "(" in value else value.split(",")
        unknown = [name for name in chosen if name not in names]
        if unknown:
            raise ConfigError(
                f"recipe={unknown[0]} is not one of the recipes in {root}: "
                f"{', '.join(names)}. `rlcli recipes` lists them with their papers."
            )


def compose(overrides: Sequence[str] = ()) -> Config:
    """rlcli.validate.compose with the recipes registered: compose(["recipe=cpu/dapo_qwen32b"])."""
    from rlcli import validate as config

    register_recipes()
    check_recipe_choices(overrides)
    return config.compose(overrides)


def listing(recipes: Sequence[Recipe]) -> str:
    """One line per recipe (its name and description): paper setups, CPU twins, demos."""
    width = max(len(r.name) for r in recipes) + 2
    titles = [
        "Paper setups (rlcli train recipe=NAME; rlcli recipes NAME shows one):",
        "CPU twins (the same algorithm on SmolLM2-135M, minutes on 2 CPU cores):",
        "Demos (rlcli's own setups, no paper: a feature on SmolLM2-135M, on CPU):",
    ]
    lines = []
    for kind, title in enumerate(titles):
        chosen = [r for r in recipes if r.kind == kind]
        lines += [title, *(f"  {r.name:<{width}}{r.description}" for r in chosen)] if chosen else []
    return "\n".join(lines)


def recipes_command(argv: list[str]) -> None:
    """`rlcli recipes [NAME]`: list the recipes, or print one."""
    if argv and argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    recipes = find_recipes()
    if not argv:
        print(listing(recipes))
        return
    by_name = {r.name: r for r in recipes}
    if len(argv) > 1 or argv[0] not in by_name:
        names = ", ".join(by_name)
        print(
            f"rlcli: error: {' '.join(argv)!r} is not a recipe; recipes: {names}.",
            file=sys.stderr,
        )
        sys.exit(2)
    print(by_name[argv[0]].path.read_text(), end="")
