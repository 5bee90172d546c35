"""One learner step on a fixed batch, in one process or as one rank of `torchrun` (gloo).

    python tests/runtime/dp_step.py MODEL_DIR OUT.pt [AGGREGATION]
    torchrun --nproc_per_node 2 tests/runtime/dp_step.py MODEL_DIR OUT.pt [AGGREGATION]

Every process builds the same batch of 7 responses of varied lengths (from a fixed seed). One
process learns on all of them; under torchrun rank r learns on rows r, r+2, ..., with the
policy sharded by FSDP2, so ranks hold unequal shares and run unequal numbers of
micro-batches. Rank 0 writes the whole gradients and parameters after the step to OUT.pt.
"""

import sys

import torch

from rlcli.rollout.batch import rollout_from_tokens, select_rows
from rlcli.runtime import distributed
from rlcli.runtime.models import load_causal_lm
from rlcli.train.forward import TokenLogprobModel
from rlcli.train.learner import UpdatePlan, learn
from rlcli.train.objective_config import objective_from_config
from rlcli.train.train_batch import TrainBatch
from rlcli.validate import section


def fixed_batch(vocab: int):
    g = torch.Generator().manual_seed(7)

    def tokens(lengths):
        return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]

    prompts, responses = tokens((5, 9, 6, 12, 7, 4, 8)), tokens((3, 11, 6, 2, 9, 5, 7))
    n = len(prompts)
    batch = rollout_from_tokens(
        prompts, responses, [""] * n, [str(i // 2) for i in range(n)], 0, "cpu"
    )
    advantages = torch.randn(n, generator=g)
    old_logp = -torch.rand(batch.response_mask.shape, generator=g) * 3
    return batch, advantages, old_logp


def main() -> None:
    model_dir, out, aggregation = sys.argv[1], sys.argv[2], (sys.argv[3:] or ["token_mean"])[0]
    device = distributed.init(torch.device("cpu"))
    policy = load_causal_lm(model_dir, "float32", device)
    world, rank = distributed.world_size(), distributed.rank()
    learner = TokenLogprobModel(policy)
    if world > 1:
        learner = distributed.shard(learner, policy)
    optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-3)
    batch, advantages, old_logp = fixed_batch(policy.config.vocab_size)
    rows = list(range(rank, len(batch.texts), world))
    algo = section("algo", "grpo", aggregation=aggregation, beta=0.0)
    objective = objective_from_config(algo, section("sampler", "hf"), norm_len=16)
    mine = TrainBatch(
        select_rows(batch, rows), torch.zeros(len(rows)), advantages[rows], old_logp[rows]
    )
    plan = UpdatePlan(mini_batches=1, micro_batch_size=3, max_tokens=40, max_grad_norm=1e-4)
    metrics = learn(learner, optimizer, objective, mine, plan)
    grads = {n: p.grad for n, p in learner.named_parameters()}
    whole = {
        "params": dict(distributed.full_parameters(learner)),
        "grads": {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()},
        "loss": metrics["loss/policy"],
        "grad_norm": metrics["actor/grad_norm"],
    }
    if distributed.is_main():
        torch.save(whole, out)
    distributed.shutdown()
    if distributed.world_size() > 1:
        distributed.end_process(0)


if __name__ == "__main__":
    main()
