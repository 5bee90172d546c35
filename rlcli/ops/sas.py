"""DCPO's Smooth Advantage Standardization (Yang et al. 2025, sec. 3.3): per-prompt running
reward statistics across steps, and the advantage blended from them."""

from typing import NamedTuple

import torch
from torch import Tensor

# A std at or below this counts as 0 in SAS: the running update of mean/var leaves
# rounding noise (~1e-17) where the exact answer is 0, and dividing by it would turn
# a constant prompt into +-1 advantages.
_ZERO_STD = 1e-8


class SasState(NamedTuple):
    """Running statistics of one prompt's rewards for DCPO's SAS.

    count: visits so far; mean, var: population mean and variance of all rewards seen.
    """

    count: int
    mean: float
    var: float


def _standardise(rewards: Tensor, mean: float, var: float) -> Tensor:
    std = var**0.5
    if std <= _ZERO_STD:  # "a term whose sigma is 0 is 0"
        return torch.zeros_like(rewards)
    return (rewards - mean) / std


def sas_advantages(rewards: Tensor, state: SasState | None) -> tuple[Tensor, SasState]:
    """DCPO Smooth Advantage Standardization (Yang et al. 2025, sec. 3.3).

    At visit i of a prompt (i = 1 when ``state`` is None) blend the advantage from this
    visit's rewards, ``A_new = (R - mu_new) / sigma_new``, with the one from every reward
    seen for the prompt, ``A_total = (R - mu_total) / sigma_total``:
    ``SA_new = (i-1)/i A_new + 1/i A_total``, ``SA_total = 1/i A_new + (i-1)/i A_total``,
    and keep elementwise the one with the smaller magnitude. sigma is the population std;
    the running update assumes the same G at every visit.
    rewards: ``[G]`` -> (advantages ``[G]``, the prompt's new state).
    """
    r64 = rewards.detach().double()
    mu_new = r64.mean().item()
    var_new = r64.var(correction=0).item()
    count, mu_old, var_old = state if state is not None else (0, 0.0, 0.0)
    i = count + 1
    mu_total = (mu_new + (i - 1) * mu_old) / i
    var_total = (var_new + (i - 1) * var_old) / i + ((i - 1) / i**2) * (mu_old - mu_new) ** 2

    adv_new = _standardise(r64, mu_new, var_new)
    adv_total = _standardise(r64, mu_total, var_total)
    sa_new = (i - 1) / i * adv_new + adv_total / i
    sa_total = adv_new / i + (i - 1) / i * adv_total
    final = torch.where(sa_new.abs() < sa_total.abs(), sa_new, sa_total)
    return final.to(rewards.dtype), SasState(i, mu_total, var_total)


class SasTracker:
    """Per-prompt SAS state across training steps; the only stateful object in ``ops``.

    A prompt id appearing twice in one call counts as two successive visits.
    """

    def __init__(self) -> None:
        self.states: dict[str, SasState] = {}

    def __call__(self, prompt_ids: list[str], rewards: Tensor) -> Tensor:
        """prompt_ids: P ids; rewards: ``[P, G]`` -> advantages ``[P, G]``."""
        if len(prompt_ids) != rewards.shape[0]:
            raise ValueError(f"{len(prompt_ids)} prompt ids for {rewards.shape[0]} groups")
        rows = []
        for pid, group in zip(prompt_ids, rewards, strict=True):
            adv, self.states[pid] = sas_advantages(group, self.states.get(pid))
            rows.append(adv)
        return torch.stack(rows)

    def state_dict(self) -> dict:
        """JSON-able snapshot: ``{"states": {prompt_id: [count, mean, var]}}``."""
        return {"states": {pid: [s.count, s.mean, s.var] for pid, s in self.states.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.states = {
            pid: SasState(int(c), float(m), float(v)) for pid, (c, m, v) in state["states"].items()
        }
