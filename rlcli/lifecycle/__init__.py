"""A training run's life around its steps: checkpoints and their manifests (`checkpoint.py`),
the run directory, its lock, what a resume may change and `config.yaml` with its history
(`run_dir.py`), the stop guard for signals and non-finite steps (`guard.py`), and pushing the
final checkpoint to the hub (`hub.py`). None of it knows what an RL step computes."""
