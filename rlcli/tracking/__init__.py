"""What a run reports: metrics.jsonl and the progress bar (`metrics`), W&B and the table of
samples (`trackers`), and the curves drawn from metrics (`plots`).
"""
