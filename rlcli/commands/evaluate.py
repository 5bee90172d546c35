"""`rlcli eval`: greedy accuracy and pass@k of a model on the held-out split, into eval.json,
and every problem's replies with their rewards into eval_samples.jsonl. The evaluation itself
is `train.held_out`'s, which `trainer.eval_every` also uses."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlcli.config import Config, ConfigError
from rlcli.data import load_splits
from rlcli.lifecycle.checkpoint import checkpoint_at, damage
from rlcli.runtime.models import launch_dir
from rlcli.train.held_out import EVAL_SAMPLES_FILE, EVAL_SEED, evaluate, write_eval_samples


def evaluate_model(cfg: Config, run_dir: Path) -> dict:
    """`rlcli eval`: evaluate the configured model on the held-out split; write eval.json (the
    metrics, to 6 decimals) and eval_samples.jsonl (per problem)."""
    from rlcli.commands.frozen_sampling import frozen_sampling
    from rlcli.runtime.seed import seed_everything

    t = cfg.trainer
    seed_everything(t.seed)
    _, test = load_splits(cfg.data)
    if not test:
        raise ConfigError(
            f"data={cfg.data.name} has no held-out problems to evaluate on: set "
            "data.num_test (or data.test_path)."
        )
    newest_checkpoint_of_a_run(cfg)
    scorer, model_path, render, sampler = frozen_sampling(cfg, test)
    n = min(len(test), cfg.eval.max_problems or len(test))
    print(f"rlcli: evaluating {model_path} on {n} held-out problems of data={cfg.data.name}")
    start = time.perf_counter()
    result = evaluate(
        sampler,
        scorer,
        render,
        test,
        cfg.eval,
        seed=t.seed + EVAL_SEED,
        progress=cfg.logger.progress,
    )
    results = {key: round(value, 6) for key, value in result.metrics.items()}
    report = {
        "model": model_path,
        "data": cfg.data.name,
        "reward": cfg.reward.name,
        "problems": n,
        **results,
        "k": cfg.eval.k,
        "temperature": cfg.eval.temperature,
        "top_p": cfg.eval.top_p,
        "correct_above": cfg.eval.correct_above,
        "time_s": round(time.perf_counter() - start, 2),
    }
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    samples = write_eval_samples(result.problems, run_dir / EVAL_SAMPLES_FILE)
    passes = ", ".join(f"{k} {v:.3f}" for k, v in results.items() if k.startswith("pass@"))
    rate = results.get("tool_call_rate")
    calls = "" if rate is None else f"; tool calls in {rate:.3f}"
    print(f"rlcli: accuracy {results['accuracy']:.3f} (greedy{calls}); {passes}")
    print(f"rlcli: wrote {run_dir / 'eval.json'}")
    print(f"rlcli: each problem's replies, rewards and correctness in {samples}")
    return report


def newest_checkpoint_of_a_run(cfg: Config) -> None:
    """`model.path=<run dir>`, as `rlcli export` takes it: the run's newest checkpoint is the
    model evaluated (model.path is set to it). A model directory, a hub id or a path that is
    neither is left to `resolve_model_path`, which says what is wrong with it."""
    path = cfg.model.path
    if not path:
        return
    local = Path(path).expanduser()
    local = local if local.is_absolute() else launch_dir() / local
    newest = checkpoint_at(local) if local.is_dir() else None
    if newest is None or newest == local:
        return
    if problem := damage(newest):
        raise ConfigError(
            f"model.path={path} is a run directory whose newest checkpoint, {newest}, is "
            f"damaged: {problem}. Give an earlier one: model.path={newest.parent}/step_N."
        )
    print(f"rlcli: model.path={path} is a run directory: evaluating its newest checkpoint")
    cfg.model.path = str(newest)
