"""The config checks of the clipped objective's pieces, before anything loads: the loss and
the estimator exist, their settings are theirs, the run gives them what they declare they
need, a clip setting changed is one the loss reads (`check_pieces`, `check_clip_fields`), and
a user's own pieces run once on a small made-up batch (`try_user_pieces`). `needs` and
`choose_over_minibatch` answer what validation asks of the pieces chosen.
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from rlcli.config import CONF_DIR, ConfigError
from rlcli.ops.advantages import ADVANTAGES, AdvantageInputs
from rlcli.ops.estimate import estimate
from rlcli.ops.losses import LOSSES
from rlcli.ops.objective import loss_of
from rlcli.ops.pieces import Piece, PieceError, settings_problem
from rlcli.ops.policy_loss import CLIP_BOUNDS, RATIOS
from rlcli.train.objective_config import objective_from_config
from rlcli.train.pieces_chosen import advantage_piece, is_file_spec, loss_piece, own_pieces


def needs(cfg, what: str) -> bool:
    """Whether the config's advantage estimator declares `what` among its needs."""
    return what in advantage_piece(cfg.algo.advantage).needs


def choose_over_minibatch(cfg) -> bool:
    """Whether tokens are chosen over the whole mini-batch (not gathered across ranks yet)."""
    return cfg.algo.top_entropy > 0 or "minibatch_stats" in loss_piece(cfg.algo.loss).needs


def check_pieces(cfg) -> None:
    """The loss and the estimator exist, their settings are theirs, and the run gives them
    what they declare they need; ConfigError naming the bad value otherwise."""
    algo, trainer = cfg.algo, cfg.trainer
    if algo.objective != "clipped":  # DPO has a loss of its own
        return
    loss, estimator = loss_piece(algo.loss), advantage_piece(algo.advantage)
    for p, given, key in (
        (loss, algo.loss_settings, "algo.loss_settings"),
        (estimator, algo.advantage_settings, "algo.advantage_settings"),
    ):
        problem = settings_problem(p, dict(given), key)
        if problem:
            raise ConfigError(problem)
    if "groups" in estimator.needs and trainer.group_size < 2:
        raise ConfigError(
            f"trainer.group_size={trainer.group_size} is too small for algo.advantage="
            f"{algo.advantage}: group-normalised advantages compare responses to the same "
            "prompt, so every response would get advantage 0. Use trainer.group_size=2 or more."
        )
    if "response_advantage" in loss.needs and "response_advantage" not in estimator.needs:
        fitting = sorted(k for k, p in ADVANTAGES.items() if "response_advantage" in p.needs)
        raise ConfigError(
            f"algo.loss={algo.loss} needs one advantage per response, but algo.advantage="
            f"{algo.advantage} gives one per token; use one of: {', '.join(fitting)}."
        )
    _check_top_entropy(algo, loss)
    check_clip_fields(algo, loss)
    if not {"ratio", "old_logp"} & loss.inputs and trainer.mini_batches * trainer.epochs > 1:
        raise ConfigError(
            f"algo.loss={algo.loss} reads no importance ratio (neither ratio nor old_logp), so "
            "it is right only on samples of the policy being updated; with trainer.mini_batches"
            f"={trainer.mini_batches} and trainer.epochs={trainer.epochs} every update after "
            "the first learns from an older policy's samples with no correction. Use "
            "trainer.mini_batches=1 trainer.epochs=1, or a loss with a ratio (ppo_clip)."
        )
    if own_pieces(cfg):
        try:
            try_user_pieces(cfg, loss, estimator)
        except PieceError as err:
            raise ConfigError(
                f"{err} (rlcli tried it on a small made-up batch before loading anything.)"
            ) from None


def _check_top_entropy(algo, loss: Piece) -> None:
    """`algo.top_entropy` is a share, and there are per-token losses for it to choose."""
    if not 0.0 <= algo.top_entropy <= 1.0:
        raise ConfigError(
            f"algo.top_entropy={algo.top_entropy} must lie in [0, 1]: the share of tokens, "
            "highest entropy first, that carry the policy loss (0 = all of them)."
        )
    if algo.top_entropy > 0 and "response_advantage" in loss.needs:
        # From the registry, in its order, so that a loss registered later is offered too.
        per_token = [k for k, p in LOSSES.items() if "response_advantage" not in p.needs]
        raise ConfigError(
            f"algo.top_entropy={algo.top_entropy} chooses the tokens that carry a per-token "
            f"loss, but algo.loss={algo.loss} gives one loss per response (its sequence ratio "
            "spans every token), so there is no token's loss to keep or drop. Use a per-token "
            f"loss ({', '.join(per_token)}) or algo.top_entropy=0."
        )


# The inputs through which a loss reads each clip setting of `algo`.
CLIP_READERS = {
    "ratio": {"ratio"},
    "clip": {"lo", "hi"},
    "eps_low": {"lo", "hi", "eps_low"},
    "eps_high": {"eps_high"},  # and lo, hi unless the clip is symmetric (1 +- eps_low)
    "dual_clip": {"dual_clip"},
}


def check_clip_fields(algo, loss: Piece) -> None:
    """A clip setting changed from its default (`conf/algo_base.yaml`) that the loss does not
    read is refused: a run that silently ignores it compares a config with itself."""
    base = OmegaConf.load(CONF_DIR / "algo_base.yaml")
    for field, readers in CLIP_READERS.items():
        if field == "eps_high" and algo.clip != "symmetric":
            readers = readers | {"lo", "hi"}
        value = getattr(algo, field)
        if readers & loss.inputs or value == base[field]:
            continue
        if field == "eps_high" and {"lo", "hi"} & loss.inputs:
            why = (
                "algo.clip=symmetric bounds the ratio by 1 +- eps_low on both sides; for a "
                "separate upper width use algo.clip=decoupled (DAPO's clip-higher)"
            )
        else:
            why = (
                f"algo.loss={algo.loss} reads only {', '.join(sorted(loss.inputs))}, so it "
                f"never uses algo.{field}; leave it at {base[field]}"
            )
        raise ConfigError(f"algo.{field}={value} would be ignored: {why}.")


def try_user_pieces(cfg, loss: Piece, estimator: Piece) -> None:
    """A researcher's own loss and estimator called once on a made-up batch (2 prompts x 2
    responses x 3 tokens, float32), so that one that raises or returns the wrong thing stops
    the run before a model loads; `PieceError` names it."""
    algo = cfg.algo
    gen = torch.Generator().manual_seed(0)
    rows, width, group = 4, 3, 2
    mask = torch.ones(rows, width)
    mask[1, 2] = 0.0  # a shorter response
    if is_file_spec(algo.advantage):
        x = AdvantageInputs(
            scores=torch.tensor([1.0, 0.0, 0.5, 0.0]),
            kl_penalty=torch.zeros(rows, width),
            mask=mask,
            group_size=group,
            prompt_ids=["a", "a", "b", "b"],
            values=torch.zeros(rows, width),
            step_rewards=torch.full((rows, width), torch.nan),
            lengths=mask.sum(-1),
            greedy_scores=torch.tensor([0.5, 0.5, 0.0, 0.0]),
            state=estimator.state() if estimator.state else None,  # a fresh one, thrown away
        )
        estimate(estimator, dict(algo.advantage_settings), x)
    if is_file_spec(algo.loss):
        old = -torch.rand(rows, width, generator=gen) - 0.5
        logp = (old + 0.1 * torch.randn(rows, width, generator=gen)).requires_grad_()
        lo, hi = CLIP_BOUNDS[algo.clip](old, eps_low=algo.eps_low, eps_high=algo.eps_high)
        per_response = "response_advantage" in loss.needs
        advantages = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand(rows, width)
        loss_of(
            objective_from_config(algo, cfg.sampler, algo.norm_len or 1),
            logp=logp,
            old_logp=old,
            ref_logp=old.clone(),
            advantages=advantages,
            mask=mask,
            entropy=torch.rand(rows, width, generator=gen),
            ratio=RATIOS[algo.ratio](logp, old, mask),
            lo=lo,
            hi=hi,
            selected=torch.zeros(rows, width, dtype=torch.bool) if not per_response else None,
        )
