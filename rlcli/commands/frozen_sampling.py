"""What the commands that sample and score a model without training it (`rlcli eval`,
`filter`, `pairs`) build from their config: its scorer, prompts and sampler, frozen."""

import sys

from rlcli.config import Config
from rlcli.data.problems import Problem, fit_prompts, prompt_renderer
from rlcli.env import response_budget
from rlcli.env.tools import unboxed_warning
from rlcli.lifecycle.guard import stop_if_a_ctrl_c_was_lost
from rlcli.rewards.scorer import Scorer
from rlcli.rollout.backends import make_sampler
from rlcli.rollout.contract import SamplerSetup
from rlcli.runtime.init_kwargs import trusts_remote_code
from rlcli.runtime.models import load_causal_lm, load_tokenizer, pick_device, resolve_model_path


def frozen_sampling(cfg: Config, problems: list[Problem]):
    """(scorer, model path, prompt renderer, sampler) for commands that sample and score a model
    without training it (`rlcli filter`, `pairs`, `eval`); the reward is checked first."""
    t = cfg.trainer
    if (unboxed := unboxed_warning(cfg.env)) is not None:
        print(unboxed, file=sys.stderr)
    device = pick_device(t.device)
    scorer = Scorer(cfg.reward, response_budget(cfg.sampler, cfg.env), device, t.dtype)
    scorer.check_records(problems, cfg.data.name)
    model_path = resolve_model_path(cfg.model, t.seed)
    tokenizer = load_tokenizer(model_path, init_kwargs=cfg.model.init_kwargs)
    render = prompt_renderer(cfg.data, cfg.env, tokenizer)
    fit_prompts(cfg.sampler, cfg.data.name, render, problems, "")  # an error if any is too long
    policy = load_causal_lm(
        model_path, t.dtype, device, trainable=False, init_kwargs=cfg.model.init_kwargs
    )
    # In trainer.dtype: what is measured (eval) or kept (filter, pairs) should not depend on
    # whether the machine has fast bfloat16.
    remote = trusts_remote_code(cfg.model.init_kwargs)  # an engine runs the model's code too
    setup = SamplerSetup(
        cfg.sampler, model_path, tokenizer, policy, device, t.dtype, t.seed, None, cfg.env, remote
    )
    sampler = make_sampler(setup)
    # A Ctrl-C that the engine's start swallowed stops the command before it samples.
    stop_if_a_ctrl_c_was_lost()
    return scorer, model_path, render, sampler
