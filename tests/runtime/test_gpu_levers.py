"""The GPU learner's levers of issue 56, each exact on the CPU against the path it replaces: the
head's chunks sized by device, selective recompute, compiled decoder layers, sums read once per
optimiser step, and the choice of recompute by free memory."""

import copy
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlcli.config.schema import ConfigError
from rlcli.ops.logprobs import chunk_elements_for, chunked_logprob_entropy
from rlcli.runtime import memory
from rlcli.runtime.memory import checkpointing_kwargs
from rlcli.runtime.models import compile_layers, compiles
from rlcli.train.forward import TokenLogprobModel
from rlcli.train.learner import UpdatePlan, learn, read_once
from rlcli.train.objective_config import objective_from_config
from rlcli.train.run import checkpointing_mode, setup
from rlcli.validate import compose
from tests.conftest import REPO, tiny

sys.path.insert(0, str(REPO / "scripts"))
from gpu_check import SMALL, synthetic_batch  # noqa: E402


def test_the_heads_chunks_are_sized_by_device_and_give_the_same_numbers():
    # On a GPU a chunk holds at least 1,024 rows at Qwen's 151,936 entries; the CPU keeps its
    # cache-sized chunks.
    assert chunk_elements_for(torch.device("cuda")) // 151936 >= 1024
    assert chunk_elements_for(torch.device("cpu")) == 2**24
    # Float64: one chunk of all rows against chunks of 3 rows, values and gradients.
    torch.manual_seed(0)
    hidden = torch.randn(40, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(500, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(500, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(500, (40,))
    results = []
    for elements in (500 * 3, 500 * 40):
        logp, entropy = chunked_logprob_entropy(hidden, weight, tokens, bias, 0.7, elements)
        grads = torch.autograd.grad((logp * 0.3 - entropy * 0.1).sum(), (hidden, weight, bias))
        results.append((logp, entropy, *grads))
    for small, whole in zip(*results, strict=True):
        torch.testing.assert_close(small, whole, rtol=1e-12, atol=1e-12)


class MatmulCount(TorchDispatchMode):
    """Matrix products issued while it is on."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in memory.KEPT_OPERATORS
        return func(*args, **(kwargs or {}))


def small_qwen(dtype=torch.float32):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", **SMALL)
    return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")


def learner_update(lm, batch, fused_head=False) -> tuple[float, torch.Tensor]:
    """One update of rlcli's learner (shared-prompt passes, the chunked head, GRPO's loss) with
    a zero learning rate: its loss and the gradients it leaves."""
    cfg = compose(["algo=grpo", "algo.beta=0"])
    objective = objective_from_config(cfg.algo, cfg.sampler, norm_len=24)
    optimizer = torch.optim.SGD(lm.parameters(), lr=0.0)  # keeps .grad, moves nothing
    plan = UpdatePlan(1, 10**6, 512, max_grad_norm=0.0)
    metrics = learn(TokenLogprobModel(lm, fused_head), optimizer, objective, batch, plan)
    return metrics["loss/policy"], torch.cat([p.grad.flatten() for p in lm.parameters()])


@pytest.fixture(scope="module")
def batch():
    return synthetic_batch(SMALL["vocab_size"], 4, 4, 32, 24, "cpu")


def test_selective_recompute_gives_the_same_gradients_and_remakes_no_product(batch):
    base = small_qwen(torch.float64)
    results = {}
    for mode in ("none", "selective", "full"):
        lm = copy.deepcopy(base)
        if mode != "none":
            lm.gradient_checkpointing_enable(checkpointing_kwargs(mode))
        lm.train()
        with MatmulCount() as products:
            results[mode] = (*learner_update(lm, batch), products.count)
    loss, grad, products = results["none"]
    assert grad.abs().sum() > 0
    for mode in ("selective", "full"):
        assert results[mode][0] == pytest.approx(loss, rel=1e-12)
        torch.testing.assert_close(results[mode][1], grad, rtol=1e-10, atol=1e-14)
    # Full recompute makes every layer's products again in the backward; selective keeps them.
    assert results["selective"][2] == products < results["full"][2]


def test_compiled_layers_and_head_give_the_eager_loss_and_gradients(batch):
    # trainer.compile: each decoder layer and the head's chunk functions compiled.
    eager = small_qwen()
    compiled = copy.deepcopy(eager)
    assert compile_layers(compiled) == SMALL["num_hidden_layers"]
    loss, grad = learner_update(eager, batch)
    compiled_loss, compiled_grad = learner_update(compiled, batch, fused_head=True)
    assert grad.abs().sum() > 0
    assert compiled_loss == pytest.approx(loss, rel=1e-5, abs=1e-7)
    torch.testing.assert_close(compiled_grad, grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_compiled_head_gives_the_eager_heads_numbers(temperature):
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(1000, 16, requires_grad=True)
    bias = torch.randn(1000, requires_grad=True)
    tokens = torch.randint(1000, (37,))
    results = []
    for fused in (False, True):
        logp, entropy = chunked_logprob_entropy(
            hidden, weight, tokens, bias, temperature, chunk_elements=8000, fused=fused
        )
        grads = torch.autograd.grad((logp * 0.3 - entropy * 0.1).sum(), (hidden, weight, bias))
        results.append((logp, entropy, *grads))
    for eager, compiled in zip(*results, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)  # float32 rounding


def test_sums_are_read_from_the_device_once():
    reads = []
    real_stack = torch.stack

    def counted(tensors, *args, **kwargs):
        reads.append(len(tensors))
        return real_stack(tensors, *args, **kwargs)

    values = {"a": torch.tensor(1.5), "b": 2.0, "c": torch.tensor([0.25]).sum()}
    torch.stack = counted
    try:
        got = read_once(values)
    finally:
        torch.stack = real_stack
    assert got == {"a": 1.5, "b": 2.0, "c": 0.25} and list(got) == ["a", "b", "c"]
    assert reads == [2]  # both tensors in one stack, one read


@pytest.mark.parametrize(("written", "compiled"), [("true", "false"), ("selective", "true")])
def test_a_run_that_recomputes_has_its_learner_in_training_mode(written, compiled):
    # transformers checkpoints only in training mode: recompute asked for and a learner left in
    # evaluation mode would keep every activation. With trainer.compile off and on.
    overrides = (f"model.gradient_checkpointing={written}", f"trainer.compile={compiled}")
    run = setup(compose(tiny(*overrides)))
    lm = run.learner.lm
    assert lm.is_gradient_checkpointing and lm.training


@pytest.mark.parametrize(
    ("free_mb", "compiled", "want"),
    [(400, False, "none"), (150, False, "selective"), (150, True, "none"),
     (60, False, "full"), (60, True, "selective"), (30, True, "full")],
)  # fmt: skip
def test_auto_recompute_is_the_least_whose_activations_fit(monkeypatch, free_mb, compiled, want):
    # SMALL's shape (2 layers, 128 + 256 wide) at 8,192-token passes, by runtime.memory's rules:
    # keeping everything needs 2 x 101 MB (2 x 63 MB compiled), selective recompute 2 x 50 MB
    # (2 x 19 MB compiled), beside 6 MB of gradients and AdamW state; the memory free and
    # whether the layers are compiled decide.
    cfg = compose(["model=tiny", "trainer.max_tokens_per_micro_batch=8192"])
    lm = small_qwen()
    monkeypatch.setattr("rlcli.train.run.free_bytes", lambda device: free_mb * 10**6)
    assert checkpointing_mode(cfg, lm, torch.device("cpu"), compiled) == want
    for written, mode in (("true", "full"), ("false", "none"), ("selective", "selective")):
        cfg.model.gradient_checkpointing = written
        assert checkpointing_mode(cfg, lm, torch.device("cpu"), compiled) == mode


@pytest.mark.parametrize(
    ("written", "device", "want"),
    [("auto", "cuda", True), ("auto", "cpu", False), ("True", "cpu", True),
     ("false", "cuda", False)],
)  # fmt: skip
def test_compile_auto_is_on_cuda_only(written, device, want):
    # A YAML or command-line True reaches the field as "True": read as the choice "true".
    cfg = compose(tiny(f"trainer.compile={written}"))
    assert compiles(cfg.trainer.compile, torch.device(device)) is want


def test_a_compile_setting_outside_the_choices_is_refused():
    with pytest.raises(ConfigError, match=r"trainer.compile='sometimes'.*auto, true, false"):
        compose(tiny("trainer.compile=sometimes"))
