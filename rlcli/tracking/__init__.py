"""What a run reports: metrics.jsonl and the progress bar (`metrics`), the trackers (W&B,
TensorBoard, MLflow: `trackers`), samples.jsonl and its console table (`samples`), the job
log and what is kept off the console (`console`), the curves drawn from metrics (`plots`), and
every metric's name and meaning (`metric_names`, from which docs/reference/metrics.md is made).
"""
