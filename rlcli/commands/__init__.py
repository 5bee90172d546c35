"""The commands other than `train`, one module each, which `cli.py` dispatches to: `eval`
(`evaluate`), `export`, `filter`, `pairs` (`make_pairs`), `plot`, the sweep summary
(`sweep`), `recipes` and `rollout-server` (`rollout_server`)."""
