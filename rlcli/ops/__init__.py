"""Pure tensor math for rlcli's objectives (see ALGORITHMS.md).

``advantages`` holds the advantage estimators, ``policy_loss`` the ratios, clip rules,
KL estimators, loss aggregations and the smaller losses (value, DPO). Every piece is a
small function over tensors found through a plain dict registry; nothing here does I/O,
reads a config or touches a model.
"""
