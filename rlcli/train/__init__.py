"""Training: one loop (`loop`) that drives RL (`run`: the run's state, its batches collected
by `rlcli.collect`; `step`: one step; `batch`: the `TrainBatch`; `learner`, `forward`,
`passes`, `critic`; `objective_config`: the loss and estimator a config names and the
`Objective` they make) and DPO (`dpo`), with held-out evaluation during training
(`held_out`). Checkpoints, the run directory, the stop guard and the hub push live in
`rlcli.lifecycle`.

The math it applies lives in `rlcli.ops`; this room is orchestration that reads top to bottom.
"""
