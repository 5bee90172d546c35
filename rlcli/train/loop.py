"""The one training loop, for RL and DPO alike: resume, step, evaluate, log, guard, save.

`train(cfg, run_dir)` picks the `Trainer` of `algo.objective` from `TRAINERS` (the clipped
RL objectives, or DPO) and drives it to `trainer.max_steps`. A trainer says how to build its
run (from a checkpoint when resuming), take one step, evaluate on held-out data and save;
the loop owns everything around that: which checkpoint to resume from, the progress bar and
metrics, Ctrl-C / SIGTERM and non-finite steps (`LoopGuard`), and when to save. Under
torchrun every rank runs the loop; rank 0 alone prints, logs and writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.config import Config, ConfigError, config_dict
from rlcli.lifecycle.checkpoint import read_state, remove_incomplete, resume_point
from rlcli.lifecycle.guard import EXIT_WORKER_LOST, LoopGuard, RunStopped, resume_command
from rlcli.lifecycle.hub import check_push, push
from rlcli.lifecycle.run_dir import check_resume, record_config
from rlcli.ops.pieces import PieceError
from rlcli.rewards.scorer import Unscorable
from rlcli.rollout.backends import resolved_old_logp
from rlcli.rollout.workers.client import WorkerLost
from rlcli.runtime import distributed
from rlcli.tracking.metrics import read_metrics
from rlcli.tracking.trackers import NoTracker, Tracker
from rlcli.train import dpo
from rlcli.train import run as rl
from rlcli.train import step as rl_step
from rlcli.train.held_out import (
    EVAL_SAMPLES_FILE,
    EVAL_SEED,
    UnscoredEvaluation,
    evaluate,
    write_eval_samples,
)
from rlcli.train.pieces_chosen import own_pieces
from rlcli.train.start_warnings import start_warnings


@dataclass(frozen=True)
class Trainer:
    """One kind of training, as the loop drives it. `run` is whatever `setup` returns; it has
    a `step` counter (optimiser steps done) that the loop advances."""

    # (cfg, checkpoint or None) -> run
    setup: Callable[[Config, Path | None], Any]
    # run -> the step's one result: metrics, the samples it scored, their advantages
    train_step: Callable[[Any], rl_step.StepResult]
    # (run, run_dir) -> eval metrics due after this step
    held_out: Callable[[Any, Path], dict[str, float]]
    # (run, run_dir) -> the held-out metrics of the weights as they are (trainer.val_before_train),
    # None when the data has no held-out split
    evaluate: Callable[[Any, Path], dict[str, float] | None]
    # (run, run_dir) -> the checkpoint written
    save: Callable[[Any, Path], Path]
    # run -> what is trained, for the first line printed
    describe: Callable[[Any], str]
    # run -> a line to print before step 1, or None
    before: Callable[[Any], str | None] = lambda run: None
    # the metric the progress bar shows
    headline: str = "reward/mean"
    # (cfg, run, a step's metrics) -> why that step learned nothing, or None when it had a signal
    no_signal: Callable[[Config, Any, dict], rl_step.NoSignal | None] = lambda *_: None


def rl_evaluate(run: rl.Run, run_dir: Path) -> dict[str, float] | None:
    """Greedy accuracy and pass@k of the current weights on the held-out split; each problem's
    replies go to eval_samples.jsonl (the latest evaluation's, marked with its step)."""
    if not run.test_problems:
        return None
    try:
        result = evaluate(
            run.sampler,
            run.scorer,
            run.render,
            run.test_problems,
            run.loop.eval,
            seed=run.loop.seed + EVAL_SEED,
        )
    except UnscoredEvaluation as err:
        if distributed.is_main():  # its replies show why none could be scored
            write_eval_samples(err.problems, run_dir / EVAL_SAMPLES_FILE, step=run.step)
        raise
    if distributed.is_main():
        write_eval_samples(result.problems, run_dir / EVAL_SAMPLES_FILE, step=run.step)
    return result.metrics


def rl_held_out(run: rl.Run, run_dir: Path) -> dict[str, float]:
    """The held-out evaluation every `trainer.eval_every` steps and at the end."""
    t = run.loop
    if not t.eval_every or (run.step % t.eval_every and run.step != t.max_steps):
        return {}
    return rl_evaluate(run, run_dir) or {}


TRAINERS: dict[str, Trainer] = {
    "clipped": Trainer(
        setup=rl.setup,
        train_step=rl_step.step,
        held_out=rl_held_out,
        evaluate=rl_evaluate,
        save=rl.save,
        describe=lambda run: f"training {run.model_path} on {run.device}",
        no_signal=lambda cfg, run, metrics: rl_step.no_signal(
            cfg, metrics, group_relative="groups" in run.estimator.needs
        ),
    ),
    "dpo": Trainer(
        setup=dpo.setup,
        train_step=lambda run: rl_step.StepResult(dpo.train_step(run)),
        held_out=lambda run, run_dir: dpo.held_out(run),
        evaluate=lambda run, run_dir: (
            dpo.pair_metrics(run, run.test_pairs) if run.test_pairs else None
        ),
        save=dpo.save,
        describe=lambda run: (
            f"DPO on {len(run.pairs.problems)} pairs with {run.model_path} on {run.device}"
        ),
        before=dpo.before_training,
        headline="reward/accuracy",
    ),
}


def evaluate_before_training(trainer: Trainer, run, run_dir: Path, tracker, data: str) -> None:
    """trainer.val_before_train: the held-out metrics of the initial weights, logged at step 0
    and printed; not again when an earlier start of this run logged them. `data`: data.name."""
    logged = distributed.is_main() and any(row["step"] == 0 for row in read_metrics(run_dir))
    if distributed.all_max(int(logged)):  # every rank evaluates, or none
        return
    try:
        metrics = trainer.evaluate(run, run_dir)
    except Unscorable as err:
        unscored_evaluation(err, 0, tracker)
        return
    if metrics is None:
        tracker.write(
            f"rlcli: trainer.val_before_train: data={data} has no held-out split, "
            "so nothing is evaluated before step 1 (set data.num_test or data.test_path)."
        )
        return
    metrics = distributed.mean_metrics({f"eval/{k}": v for k, v in metrics.items()})
    tracker.log({"step": 0, **metrics})  # a row of evaluation only, as eval_every's are
    shown = ", ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in metrics.items())
    tracker.write(f"rlcli: held-out before training (step 0): {shown}")


def unscored_evaluation(err: Unscorable, step: int, tracker) -> None:
    """Say that an evaluation measured nothing. Training goes on: its own batches are scored
    apart, and a TRL user expects an unscorable evaluation to be logged, not to end the run."""
    tracker.write(
        f"rlcli: warning: the held-out evaluation at step {step} measured nothing: none of its "
        f"{err.count} greedy replies could be scored ({err.why}; {EVAL_SAMPLES_FILE} holds "
        "them). Its eval/* metrics are left out, and training goes on."
    )


def unscorable_batch(
    err: Unscorable, run, trainer: Trainer, tracker, run_dir: Path, last_saved: int
) -> ConfigError:
    """A batch without a single score cannot be trained on (it came before the update)."""
    what = f"No response of step {run.step + 1}'s batch could be scored ({err.count} responses; "
    what += f"{err.why}), so the run stopped before that step"
    fix = "Fix the reward's code (a resume refuses changed reward.* settings)"
    return stopped_before_update(what, fix, run, trainer, tracker, run_dir, last_saved)


def piece_failed(
    err: PieceError, run, trainer: Trainer, tracker, run_dir: Path, last_saved: int
) -> ConfigError:
    """The loss or the estimator (most often a user's own) raised or returned something unusable
    in step run.step + 1; saved first when no update of that step had happened."""
    what = f"In step {run.step + 1}: {str(err).rstrip('.')}"
    if err.updated:  # the weights are part-way through the step: not a state to save
        tracker.finish()
        return ConfigError(
            f"{what}. An update of that step had already happened, so it was not saved; the last "
            f"checkpoint is in {run_dir / 'checkpoints'}. Fix the function, then resume with:\n"
            f"  {resume_command(run_dir)}"
        )
    fix = "Fix the function"
    return stopped_before_update(what, fix, run, trainer, tracker, run_dir, last_saved)


def stopped_before_update(
    what: str, fix: str, run, trainer: Trainer, tracker, run_dir: Path, last_saved: int
) -> ConfigError:
    """Save what this start trained since its last checkpoint, then the message that ends the
    run: `what` stopped it before the step's first update, and `fix` is the user's move."""
    tracker.finish()
    if run.step == 0:  # nothing trained, nothing to resume
        return ConfigError(f"{what}; nothing was trained. {fix} and run again.")
    if distributed.world_size() > 1:  # a save needs every process, and the others are mid-step
        kept = f"nothing more was saved (checkpoints so far: {run_dir / 'checkpoints'})"
    elif run.step > last_saved:
        kept = f"step {run.step} is saved in {trainer.save(run, run_dir)}"
    else:
        kept = f"step {run.step} was already saved in {run_dir / 'checkpoints'}"
    return ConfigError(f"{what}; {kept}. {fix}, then resume with:\n  {resume_command(run_dir)}")


def worker_lost(lost: WorkerLost, run, trainer: Trainer, tracker, run_dir: Path) -> RunStopped:
    """Save the last completed step, then the message that ends the run."""
    saved = trainer.save(run, run_dir)
    tracker.finish()
    return RunStopped(
        f"{lost} The run stopped after step {run.step} and saved it in {saved}. Fix what "
        "stopped the worker (memory, a node gone; servers named in sampler.urls must be "
        "started again by hand; local ones start with the run), then resume with:\n  "
        f"{resume_command(run_dir)}",
        EXIT_WORKER_LOST,
    )


def _resume_point(cfg: Config, run_dir: Path, say) -> tuple[Path | None, bool]:
    """(the checkpoint this start continues from or None, whether the run is already
    finished), decided before any model loads; the start (or resume) is recorded in
    config.yaml. A finished run rerun with a push pushes its last checkpoint."""
    t, main = cfg.trainer, distributed.is_main()
    if main and t.push_to_hub is not None:
        check_push(t.push_to_hub)  # first: a finished run rerun with a push pushes it (below)
    if main:
        for name in remove_incomplete(run_dir):
            say(f"rlcli: removed {name}, a checkpoint whose writing was interrupted")
    checkpoint = resume_point(t.resume, run_dir, say, set_aside=main)
    event = "started at step 0"
    if checkpoint is not None:
        # Before any model loads: a finished run, or one this command would change, ends here.
        state = read_state(checkpoint)
        if state["step"] >= t.max_steps:
            say(
                f"rlcli: this run is finished: {checkpoint} is step {state['step']} and "
                f"trainer.max_steps={t.max_steps}; nothing to train. Raise trainer.max_steps "
                "to train further."
            )
            if main and t.push_to_hub is not None:
                url = push(checkpoint, t.push_to_hub)
                say(f"rlcli: pushed {checkpoint.name} to the hub: {url}")
            return checkpoint, True
        old_logp_now = resolved_old_logp(cfg.sampler, cfg.trainer)
        saved, current = state.get("config"), config_dict(cfg)
        for line in check_resume(saved, current, old_logp_now, checkpoint, state["step"]):
            say(line)
        event = f"resumed from {checkpoint} at step {state['step']}"
    if main:
        record_config(run_dir, config_dict(cfg), f"{event}: {resume_command(run_dir)}")
    return checkpoint, False


def _start(cfg: Config, trainer: Trainer, checkpoint: Path | None, run_dir: Path, say):
    """(the run built from `checkpoint` or afresh, its tracker), with the lines a run prints
    before its first step."""
    try:
        run = trainer.setup(cfg, checkpoint)
    except WorkerLost as lost:  # before this start trained anything: nothing new to save
        raise RunStopped(
            f"{lost} Nothing was trained in this start. Once the worker runs, start again "
            f"with:\n  {resume_command(run_dir)}",
            EXIT_WORKER_LOST,
        ) from None
    if checkpoint is not None:
        say(f"rlcli: resuming from {checkpoint} (step {run.step})")
    world = distributed.world_size()
    processes = f" in {world} processes" if world > 1 else ""
    say(f"rlcli: {trainer.describe(run)}{processes}; writing to {run_dir}")
    tracker = NoTracker()
    if distributed.is_main():
        config, steps = dataclasses.asdict(cfg), cfg.trainer.max_steps
        tracker = Tracker(cfg.logger, config, steps, run_dir, trainer.headline, run.step + 1)
    if cfg.algo.objective == "clipped":
        for line in start_warnings(cfg):
            tracker.write(line)
    if run.step == 0 and cfg.trainer.val_before_train:
        evaluate_before_training(trainer, run, run_dir, tracker, cfg.data.name)
    elif run.step == 0 and (line := trainer.before(run)):
        tracker.write(line)
    return run, tracker


def _note_no_signal(cfg: Config, trainer: Trainer, run, metrics: dict, unlearned: dict,
                    tracker) -> None:  # fmt: skip
    """A warning the first time a step learns nothing for a given reason; every such step is
    counted in `unlearned`, {(what it lacked, the metric that shows it): [steps]}."""
    if (lack := trainer.no_signal(cfg, run, metrics)) is None:
        return
    if (lack.what, lack.metric) not in unlearned:  # once a run; counted at the end
        tracker.write(
            f"rlcli: warning: step {run.step} {lack.what} ({lack.metric}, {lack.effect}): "
            f"{lack.why}."
        )
    unlearned.setdefault((lack.what, lack.metric), []).append(run.step)


def _finish(cfg: Config, run, tracker, saved: Path, unlearned: dict, first_step: int,
            run_dir: Path, say) -> None:  # fmt: skip
    """The lines a finished run prints (where its metrics, curves and checkpoints are), and its
    push to the hub."""
    curves = tracker.finish()
    for (what, metric), steps in unlearned.items():
        say(
            f"rlcli: warning: {len(steps)} of the {run.step - first_step + 1} steps {what} "
            f"({metric}); the warning at step {steps[0]} says why."
        )
    say(f"rlcli: metrics in {tracker.path}")
    say(f"rlcli: curves in {curves}")
    say(f"rlcli: checkpoints in {run_dir / 'checkpoints'}")
    if distributed.is_main() and cfg.trainer.push_to_hub is not None:
        say(f"rlcli: pushed {saved.name} to the hub: {push(saved, cfg.trainer.push_to_hub)}")
    distributed.shutdown()


def train(cfg: Config, run_dir: Path) -> Path:
    """Run steps up to `cfg.trainer.max_steps`, writing metrics and checkpoints under
    `run_dir`; continue a run from its checkpoint as `trainer.resume` says. Returns the path
    of metrics.jsonl."""
    t, trainer = cfg.trainer, TRAINERS[cfg.algo.objective]
    say = print if distributed.is_main() else lambda *_: None
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint, finished = _resume_point(cfg, run_dir, say)
    if finished:
        return run_dir / "metrics.jsonl"
    run, tracker = _start(cfg, trainer, checkpoint, run_dir, say)
    # unlearned: (what a step lacked, the metric that shows it) -> this start's steps lacking it
    first_step, unlearned = run.step + 1, {}
    last_saved = run.step  # the checkpoint resumed from, or nothing (0)
    with LoopGuard(t.max_bad_steps, tracker.write, own_pieces(cfg)) as guard:
        while run.step < t.max_steps:
            try:
                result = trainer.train_step(run)
            except Unscorable as err:  # before the update: the step did not happen
                raise unscorable_batch(err, run, trainer, tracker, run_dir, last_saved) from None
            except PieceError as err:
                raise piece_failed(err, run, trainer, tracker, run_dir, last_saved) from None
            except WorkerLost as err:  # before the update: the step did not happen
                raise worker_lost(err, run, trainer, tracker, run_dir) from None
            # A worker lost in the weight push, after the update: the step happened. Its rows
            # are written before the run stops with it saved, so a resume neither loses nor
            # repeats it.
            metrics, lost = result.metrics, result.lost
            run.step += 1
            # Under torchrun: averaged over the ranks (times: the slowest rank's).
            metrics = distributed.mean_metrics({"step": run.step, **metrics})
            try:
                if lost is None:
                    held_out = trainer.held_out(run, run_dir)
                    metrics.update({f"eval/{k}": v for k, v in held_out.items()})
            except WorkerLost as err:
                lost = err  # the step's rows are written all the same, without the eval
            except Unscorable as err:  # the evaluation measured nothing; the step is sound
                unscored_evaluation(err, run.step, tracker)
            tracker.log(metrics, result.samples, result.advantages)
            _note_no_signal(cfg, trainer, run, metrics, unlearned, tracker)
            guard.observe(run.step, metrics)
            if lost is not None:
                raise worker_lost(lost, run, trainer, tracker, run_dir) from None
            # Every rank stops at the same step, whichever of them was signalled.
            stopping = bool(distributed.all_max(int(guard.stopping)))
            due = t.save_every and run.step % t.save_every == 0
            if due or run.step == t.max_steps or stopping:
                saved, last_saved = trainer.save(run, run_dir), run.step
            if stopping:
                tracker.finish()
                raise guard.stop(run.step, saved, run_dir)
    _finish(cfg, run, tracker, saved, unlearned, first_step, run_dir, say)
    return tracker.path
