"""Pure tensor math for rlcli's objectives (docs/algorithms.md gives their formulas; each
function cites its paper).

``advantages`` holds the advantage estimators, ``policy_loss`` the ratios, clip rules,
surrogates, KL estimators, loss aggregations and the smaller losses (value, DPO),
``objective`` the clipped policy objective assembled from those pieces, and ``logprobs``
the chunked log-prob and entropy of the taken tokens. Every piece is a
small function over tensors found through a plain dict registry; nothing here does I/O,
reads a config or touches a model.
"""
