"""The sampler contract: a backend is its module in rollout/backends/ (and its YAML); the
checks ask a backend what it can do, never its name.

`echo` below is a backend defined only as a module in a folder added to the backends' search
path, as a user's new backend would be, with a sampler that answers every prompt with its own
tokens: a fake engine, since what is tested is the wiring around a sampler, not sampling.
"""

import pytest
import torch

import rlcli.rollout.backends as backends
from rlcli.config import ConfigError
from rlcli.config.schema import CONF_DIR
from rlcli.rollout.backends import (
    backend,
    backend_names,
    check_sampler,
    make_sampler,
    resolved_old_logp,
)
from rlcli.rollout.contract import Sampler, SamplerSetup
from rlcli.validate import compose, section

ECHO = """
import torch
from rlcli.config import ConfigError
from rlcli.rollout.batch import rollout_from_tokens
from rlcli.rollout.contract import Backend, Sampler


class EchoSampler(Sampler):
    device = torch.device("cpu")

    def __init__(self, tokenizer):
        self.tokenizer, self.synced = tokenizer, 0

    def sample(self, prompts, group_size, prompt_ids, answers, temperature=None, seed=None,
               top_p=None):
        starts = [self.tokenizer(p)["input_ids"] for p in prompts for _ in range(group_size)]
        return rollout_from_tokens(
            starts, [ids[-1:] * 3 for ids in starts], pad_id=0, device=self.device,
            prompt_ids=[i for i in prompt_ids for _ in range(group_size)],
            answers=[a for a in answers for _ in range(group_size)],
            texts=["echo"] * len(starts),
        )

    def sync(self, policy):
        self.synced += 1


class EchoBackend(Backend):
    name, title = "echo", "the echo sampler"
    stop_strings = True

    def check(self, sampler, model):
        if sampler.top_k > 5:
            raise ConfigError(f"sampler.top_k={sampler.top_k}: echo keeps at most 5")

    def make(self, setup):
        return EchoSampler(setup.tokenizer)

BACKEND = EchoBackend()
"""


@pytest.fixture
def echo(tmp_path, monkeypatch):
    (tmp_path / "echo.py").write_text(ECHO)
    monkeypatch.setattr(backends, "__path__", [*backends.__path__, str(tmp_path)])
    yield backend("echo")


def test_every_backend_has_its_yaml_and_every_yaml_its_backend():
    yamls = sorted(p.stem for p in (CONF_DIR / "sampler").glob("*.yaml"))
    assert backend_names() == yamls == ["hf", "vllm"]
    for name in backend_names():
        assert backend(name).name == name


def test_a_backend_module_alone_is_a_choice_with_its_capabilities_and_checks(echo, tiny_model_dir):
    from rlcli.runtime.models import load_tokenizer

    assert "echo" in backend_names()
    model = section("model", "tiny")
    # Its capabilities, not its name, decide: it has stop strings, so sampler.stop is allowed...
    check_sampler(section("sampler", "hf", name="echo", stop=["\n"]), model)
    # ...and the message for a backend without them now names it beside vLLM.
    with pytest.raises(ConfigError, match=r"needs sampler=echo or sampler=vllm: the transformers"):
        check_sampler(section("sampler", "hf", stop=["\n"]), model)
    # It has no log-probs of its own: old_logp=sampler is refused naming only those that do.
    with pytest.raises(ConfigError, match=r"old_logp=sampler needs sampler=vllm: the echo samp"):
        check_sampler(section("sampler", "hf", name="echo", old_logp="sampler"), model)
    with pytest.raises(ConfigError, match=r"rollout workers are servers of sampler=vllm; the echo"):
        check_sampler(section("sampler", "hf", name="echo", workers=2), model)
    with pytest.raises(ConfigError, match="echo keeps at most 5"):  # its own check
        check_sampler(section("sampler", "hf", name="echo", top_k=9), model)
    # vLLM's log-probs are used under auto where compute is bfloat16; echo has none to use.
    trainer = compose(["model=tiny", "sampler=hf"]).trainer
    assert resolved_old_logp(section("sampler", "hf", name="echo"), trainer) == "learner"

    tokenizer = load_tokenizer(tiny_model_dir)
    setup = SamplerSetup(section("sampler", "hf", name="echo"), tiny_model_dir, tokenizer,
                         torch.nn.Linear(1, 1), torch.device("cpu"), "float32", seed=0)  # fmt: skip
    sampler = make_sampler(setup)
    assert isinstance(sampler, Sampler) and type(sampler).__name__ == "EchoSampler"
    rollout = sampler.sample(["a b", "c d e"], 2, ["p0", "p1"], ["1", "2"])
    assert rollout.response_mask.sum(-1).tolist() == [3, 3, 3, 3]
    assert rollout.sampler_logp is None
    assert sampler.state_dict() == {} and sampler.metrics() == {}  # the contract's defaults


def test_a_sampler_without_multi_turn_says_so_by_its_class_name(echo, tiny_model_dir):
    from rlcli.runtime.models import load_tokenizer

    setup = SamplerSetup(section("sampler", "hf", name="echo"), tiny_model_dir,
                         load_tokenizer(tiny_model_dir), torch.nn.Linear(1, 1),
                         torch.device("cpu"), "float32", seed=0)  # fmt: skip
    with pytest.raises(NotImplementedError, match="EchoSampler cannot run multi-turn episodes"):
        make_sampler(setup).turns([[1, 2]], [4], [])
