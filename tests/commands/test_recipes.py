"""The paper setups in recipes/: each composes and documents itself, each CPU twin trains.

Recipes are found by walking recipes/ recursively, so a new file is covered automatically.
The CPU twins run one real step each (SmolLM2-135M, vLLM on CPU); they share the sampler's
engine settings, so one vLLM engine serves them all.
"""

import gc
import math
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rlcli.commands.filter import filter_dataset
from rlcli.commands.recipes import (
    RECIPES_DIR,
    check_recipe_choices,
    compose,
    find_recipes,
    register_recipes,
)
from rlcli.config import ConfigError
from rlcli.data import load_splits
from rlcli.train.run import setup
from rlcli.train.step import train_step

RECIPES = find_recipes()
PAPERS = [r for r in RECIPES if r.kind == 0]
TWINS = [r for r in RECIPES if r.cpu_twin]
# The algorithm a twin must keep from its paper recipe: everything that shapes the objective.
SHAPING = (
    "advantage", "ratio", "clip", "eps_low", "eps_high", "dual_clip", "kl", "beta", "kl_in",
    "aggregation", "norm_len", "dynamic_sampling", "overlong_filter", "dupo_fill",
    "advantage_settings", "ptx_coef", "objective",
)  # fmt: skip
# Twins whose reward differs from their paper's, and why (their headers say so too).
REWARD_STAND_INS = {"cpu/ppo_instructgpt": "no reward model runs offline on CPU: reward=math"}


def names(recipes):
    return [r.name for r in recipes]


def leaves(node, prefix=""):
    """(dotted key, value) of every leaf of a config mapping."""
    for key, value in node.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def rlcli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "rlcli", *args], capture_output=True, text=True, cwd=cwd
    )


def test_every_paper_recipe_has_a_cpu_twin_and_back():
    assert len(PAPERS) >= 7
    assert sorted(f"cpu/{r.name}" for r in PAPERS) == sorted(names(TWINS))


@pytest.mark.parametrize("recipe", RECIPES, ids=names(RECIPES))
def test_recipe_composes_and_its_values_arrive(recipe):
    cfg = compose([f"recipe={recipe.name}"])
    register_recipes()  # the ${recipe_file:...} resolver, for reading the file on its own
    own = OmegaConf.to_container(OmegaConf.load(recipe.path), resolve=True)
    choices = own.pop("defaults")
    for entry in choices:
        if isinstance(entry, dict):
            [(key, choice)] = entry.items()
            assert getattr(cfg, key.removeprefix("override /")).name == choice, entry
    for key, value in leaves(own):
        if key == "model.gradient_checkpointing":  # true/false/auto, read as a lowercase choice
            value = str(value).lower()
        assert OmegaConf.select(OmegaConf.structured(cfg), key) == value, key


@pytest.mark.parametrize("recipe", RECIPES, ids=names(RECIPES))
def test_recipe_header_gives_command_description_paper_and_hardware(recipe):
    assert recipe.command == f"rlcli train recipe={recipe.name}"
    assert recipe.description and len(recipe.description) <= 72  # one listing line
    header = recipe.path.read_text().split("\ndefaults:")[0]
    assert "Hardware:" in header
    if recipe in PAPERS:
        assert "Paper:" in header and "Reported:" in header
        assert f"recipe=cpu/{recipe.name}" in header  # points at its twin
    if "dupo" in recipe.name:
        assert f"rlcli filter recipe={recipe.name}" in header  # DUPO's pre-filter first


@pytest.mark.parametrize("recipe", RECIPES, ids=names(RECIPES))
def test_every_recipe_field_has_a_comment_above_it(recipe):
    lines = recipe.path.read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        key = re.match(r"^\s*([A-Za-z_]\w*):", line)
        header = line.rstrip().endswith(":")  # a group such as `trainer:` is documented below
        if key and key.group(1) != "defaults" and not header:
            if not lines[i - 1].strip().startswith("#"):
                undocumented.append(f"{i + 1}: {line.strip()}")
    assert not undocumented, "\n".join(undocumented)
    assert all(len(line) <= 100 for line in lines)


@pytest.mark.parametrize("twin", TWINS, ids=names(TWINS))
def test_cpu_twin_keeps_its_papers_algorithm_and_reward(twin):
    cfg = compose([f"recipe={twin.name}"])
    paper = compose([f"recipe={twin.name.removeprefix('cpu/')}"])
    for field in SHAPING:
        assert getattr(cfg.algo, field) == getattr(paper.algo, field), field
    assert cfg.algo.name == paper.algo.name
    if twin.name not in REWARD_STAND_INS:
        assert cfg.reward.components == paper.reward.components
        assert cfg.reward.weights == paper.reward.weights
    # ...and shrinks what a 2-core CPU cannot afford.
    assert (cfg.model.name, cfg.trainer.dtype) == ("smollm2_135m", "float32")
    # Generated problems, or (an agent with tools) a shipped question file.
    assert cfg.data.name in ("arith", "countdown") or (
        cfg.env.name != "none" and cfg.data.path.startswith(str(RECIPES_DIR))
    )
    assert cfg.trainer.prompts_per_step * cfg.trainer.group_size <= 16
    assert cfg.sampler.max_new_tokens <= 64


# (The calculator demo trains in test_env.py's SmolLM2 run.)
@pytest.mark.parametrize("twin", TWINS, ids=names(TWINS))
def test_cpu_twin_trains_one_step_with_finite_metrics(twin):
    cfg = compose([f"recipe={twin.name}"])
    run = setup(cfg)
    metrics = train_step(run)
    numbers = {k: v for k, v in metrics.items() if not k.startswith("_")}
    assert {"loss/policy", "actor/grad_norm", "reward/mean"} <= numbers.keys()
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    assert numbers["response/length_mean"] > 0
    if cfg.algo.ptx_coef > 0:
        assert numbers["ptx/loss"] > 0  # the shipped pretraining text was read and used
    del run
    gc.collect()


def test_dupo_twin_prefilter_writes_data_its_train_command_loads(tmp_path):
    out = tmp_path / "search_unsolved.jsonl"
    overrides = ["data.limit=3", "filter.k=2", f"filter.out={out}"]
    cfg = compose(["recipe=cpu/dupo_websailor", *overrides])
    report = filter_dataset(cfg, tmp_path)  # 3 questions x 2 episodes with the search tool
    assert out.exists() and report
    # The train command in the twin's header, with the file just written.
    cfg = compose(["recipe=cpu/dupo_websailor", f"data.path={out}", "data.num_test=0"])
    train, _ = load_splits(cfg.data)
    kept = {p.question for p in train}
    assert kept and len(kept) <= 3 and all(q.count("<tool>search</tool>") == 1 for q in kept)


def test_user_overrides_beat_the_recipe():
    cfg = compose(
        ["recipe=cpu/dapo_qwen32b", "trainer.lr=3e-3", "algo=grpo", "sampler.max_new_tokens=16"]
    )
    assert (cfg.trainer.lr, cfg.algo.name, cfg.sampler.max_new_tokens) == (3e-3, "grpo", 16)
    assert cfg.trainer.group_size == 4 and cfg.reward.name == "dapo"  # the rest still applies


def test_recipe_file_paths_resolve_from_any_directory(tmp_path):
    """Through the CLI, run elsewhere: the shipped text is found by an absolute path."""
    done = rlcli(
        "train", "--cfg", "job", "--resolve", "recipe=cpu/ppo_instructgpt", "trainer.lr=3e-3",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = OmegaConf.create(done.stdout)
    assert printed.trainer.lr == 3e-3 and printed.algo.name == "ppo"
    assert printed.algo.ptx_path == str(RECIPES_DIR / "data" / "pretraining_sample.txt")


@pytest.mark.parametrize("command", ["train", "filter", "eval", "pairs"])
def test_recipe_works_for_every_hydra_command(command):
    done = rlcli(command, "--cfg", "job", "recipe=cpu/dupo_websailor")
    assert done.returncode == 0, done.stderr
    assert OmegaConf.create(done.stdout).algo.name == "dupo"


@pytest.mark.parametrize(
    "args", [["train", "recipe=nope"], ["train", "-m", "recipe=cpu/dapo_qwen32b,nope"]]
)
def test_unknown_recipe_is_a_clear_error(args):
    done = rlcli(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "recipe=nope is not one of the recipes" in done.stderr
    assert all(r.name in done.stderr for r in RECIPES)  # the valid choices are listed


def test_recipe_choices_are_checked_before_hydra():
    check_recipe_choices(["recipe=cpu/dapo_qwen32b", "recipe=null", "trainer.lr=1"])
    with pytest.raises(ConfigError, match="recipe=cpu/nope"):
        check_recipe_choices(["recipe=cpu/dapo_qwen32b,cpu/nope"])


def test_recipes_command_lists_every_file_with_its_description():
    done = rlcli("recipes")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(RECIPES) == len(list(RECIPES_DIR.rglob("*.yaml")))
    for recipe in RECIPES:
        assert f"  {recipe.name}  " in done.stdout
        [line] = [x for x in lines if x.split()[:1] == [recipe.name]]
        assert line.endswith(recipe.description)
    # CPU twins are listed after the paper setups, under their own heading.
    twins_at = next(i for i, x in enumerate(lines) if x.startswith("CPU twins"))
    assert all(lines.index(x) > twins_at for x in lines if x.strip().startswith("cpu/"))


def test_recipes_command_prints_one_recipe_and_rejects_unknown_names():
    done = rlcli("recipes", "cpu/dapo_qwen32b")
    assert done.returncode == 0
    assert done.stdout == (RECIPES_DIR / "cpu" / "dapo_qwen32b.yaml").read_text()
    done = rlcli("recipes", "nope")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "cpu/dapo_qwen32b" in done.stderr
