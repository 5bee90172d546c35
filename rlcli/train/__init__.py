"""Training: one loop (`loop`) that drives RL (`run`: the run's state, its batches collected
by `rlcli.collect`; `step`: one step; `batch`: the `TrainBatch`; `learner`, `forward`,
`passes`, `critic`; `pieces_chosen`: the loss and estimator a config names, registered or a
user's own; `objective_checks`: their config checks; `objective_config`: the `Objective` they
make; `pieces_help`, `start_warnings`: what `--help` and a run's start say of them) and DPO
(`dpo`), with held-out evaluation during training (`held_out`). Checkpoints, the run
directory, the stop guard and the hub push live in `rlcli.lifecycle`.

The math it applies lives in `rlcli.ops`; this room is orchestration that reads top to bottom.
"""
