"""Launching a run's processes beyond this machine: `launcher=ray` places the learner's ranks
and the rollout workers on a Ray cluster, each the same `rlcli` command a user would start there
by hand (`ray_run.py`, `launch`); what the run holds and whether the cluster has room for it,
pure (`placement.py`); the actor that runs one of those commands on its node (`hosts.py`).
Nothing here is imported by a run on one machine (launcher=local), so Ray stays optional.
"""
