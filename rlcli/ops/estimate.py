"""Calling the advantage estimator `algo.advantage` names (`ops.advantages.ADVANTAGES`, or a
researcher's own): on a copy of the step's inputs, with failed rewards handled once here rather
than in every estimator, and its output checked."""

import dataclasses

import torch
from torch import Tensor

from rlcli.ops.advantages import AdvantageInputs
from rlcli.ops.pieces import Piece, PieceError, advantage_output_problem, call_piece


def _rows(x: AdvantageInputs, rows: Tensor, group_size: int) -> AdvantageInputs:
    """The inputs of the responses `rows` only, in groups of `group_size`."""
    count = len(x.prompt_ids)

    def pick(value):
        if isinstance(value, Tensor) and value.dim() and value.shape[0] == count:
            return value[rows.to(value.device)]
        return value

    fields = {f.name: pick(getattr(x, f.name)) for f in dataclasses.fields(x)}
    fields["prompt_ids"] = [x.prompt_ids[i] for i in rows.tolist()]
    return AdvantageInputs(**{**fields, "group_size": group_size})


def _scored_groups(p: Piece, settings: dict, x: AdvantageInputs):
    """`p` on the groups whose rewards were all scored, together, and on each other group's
    scored responses alone, as a smaller group (two at least, else no call): (advantages,
    returns) with 0 for every response left out."""
    G = x.group_size
    scored = (~x.scores.isnan()).view(-1, G).cpu()  # [P, G]
    complete = scored.all(-1)  # [P]
    calls = [(complete.repeat_interleave(G).nonzero().flatten(), G)]
    for group in (~complete).nonzero().flatten().tolist():
        rows = group * G + scored[group].nonzero().flatten()
        calls.append((rows, len(rows)))
    advantages = returns = None
    for rows, size in calls:
        if size < 2 or len(rows) == 0:
            continue  # no baseline to compare with: advantage 0
        adv, ret = call_piece(p, "algo.advantage", settings, x=_rows(x, rows, size))
        if not isinstance(adv, Tensor) or adv.shape[0] != len(rows):
            return adv, ret  # the caller's check names the wrong output
        if advantages is None:
            advantages = adv.new_zeros((len(x.prompt_ids), *adv.shape[1:]))
        advantages[rows.to(adv.device)] = adv
        if isinstance(ret, Tensor):
            if returns is None:
                returns = ret.new_zeros((len(x.prompt_ids), *ret.shape[1:]))
            returns[rows.to(ret.device)] = ret
    if advantages is None:
        advantages = torch.zeros(len(x.prompt_ids), device=x.scores.device)
    return advantages, returns


def estimate(p: Piece, settings: dict, x: AdvantageInputs) -> tuple[Tensor, Tensor | None]:
    """The estimator `p` on a copy of `x` (writing into its inputs changes nothing the step
    reads after it), its output checked: a `PieceError` names it when it raises, returns
    something else than (advantages [B] or [B, T], returns or None), or a non-finite
    advantage for a scored response.

    Failed rewards (NaN scores) are handled here, once, for every estimator that compares a
    response with its group only (`needs` groups, not whole_batch): a group with a failed
    reward is estimated from its scored responses alone, as if the group were that much
    smaller, and a group with fewer than two scored responses gets 0 (GRPO's std and RLOO's
    leave-one-out mean need two); an unscored response gets 0 (the step keeps it out of the
    loss). Estimators over the whole batch see NaN where a reward failed."""
    copies = {
        f.name: v.clone() if isinstance(v := getattr(x, f.name), Tensor) else v
        for f in dataclasses.fields(x)
    }
    x = AdvantageInputs(**copies)
    by_group = "groups" in p.needs and "whole_batch" not in p.needs
    if by_group and bool(x.scores.isnan().any()):
        out = _scored_groups(p, settings, x)
    else:
        out = call_piece(p, "algo.advantage", settings, x=x)
    rows, width = x.mask.shape
    problem = advantage_output_problem(out, rows, width, "response_advantage" in p.needs)
    if problem is None:
        scored = ~x.scores.isnan().to(out[0].device)
        if not bool(torch.isfinite(out[0][scored]).all()):
            problem = "a non-finite advantage (nan or inf) for a response whose reward was scored"
    if problem is not None:
        raise PieceError(
            f"algo.advantage={p.name} returned {problem}. An estimator returns (advantages, "
            f"returns or None), the advantages one per response, [{rows}], or per token, "
            f"[{rows}, {width}], finite wherever the reward was scored."
        )
    return out
