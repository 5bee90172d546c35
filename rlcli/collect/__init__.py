"""Collecting batches: prompts rendered, sampled, scored and shaped into what a step trains on.

`collector.py`'s `Collector` is the training loop's stage (draw the step's problems, sample a
group each, score them, DAPO's dynamic sampling and DUPO's duplicates); `sampling.py` samples
and scores a problem list for it and for the commands that only sample (`rlcli eval`,
`filter`, `pairs`); `shaping.py` holds the pure rules of which groups a step keeps.
"""
