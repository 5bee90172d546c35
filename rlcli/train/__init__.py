"""Training: one loop (`loop`) that drives RL (`run`: the run's state; `step`: one step;
`batch`: the `TrainBatch`; `learner`, `critic`; `shaping`: DAPO and DUPO batch shaping) and
DPO (`dpo`), with checkpoints (`checkpoint`), the run directory (`run_dir`: its lock, what a
resume may change, config.yaml), the stop guard (`guard`), held-out evaluation during
training (`held_out`) and the push of the final checkpoint to the hub (`hub`).

The math it applies lives in `rlcli.ops`; this room is orchestration that reads top to bottom.
"""
