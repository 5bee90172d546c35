"""What a run placed on a Ray cluster holds, and whether the cluster has room for it: pure
functions over numbers, checked before anything starts (docs/scaling.md, "On a Ray cluster").

A run holds one bundle of resources per learner rank and one per rollout worker. Ray places
each bundle whole on one node, so a cluster whose totals suffice can still be too small: a
worker of 4 GPUs needs a node with 4 free. `shortfall` says which, in a line that names the
settings to change, since Ray itself would wait for the resources forever.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcli.config import ConfigError


@dataclass(frozen=True)
class Role:
    """`count` processes of one kind, each holding `cpus` CPUs and `gpus` GPUs on one node."""

    name: str  # "learner rank" or "rollout worker", as a message names them
    count: int
    cpus: float
    gpus: int

    def bundles(self) -> list[dict[str, float]]:
        """Ray's resource bundles, one per process."""
        one = {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}
        return [dict(one) for _ in range(self.count)]


def roles(
    learner_ranks: int,
    cpus_per_rank: float,
    workers: int,
    cpus_per_worker: float,
    tensor_parallel: int,
    on_gpu: bool,
) -> list[Role]:
    """The learner's ranks (one GPU each on CUDA) and the rollout workers (`tensor_parallel`
    GPUs each on CUDA); no workers when the ranks sample in their own processes."""
    placed = [Role("learner rank", learner_ranks, cpus_per_rank, 1 if on_gpu else 0)]
    if workers:
        placed.append(
            Role("rollout worker", workers, cpus_per_worker, tensor_parallel if on_gpu else 0)
        )
    return placed


def _counted(role: Role, unit: str) -> str:
    """ "2 rollout workers × 4 GPUs" """
    each = role.gpus if unit == "GPU" else role.cpus
    plural = "s" if role.count != 1 else ""
    return f"{role.count} {role.name}{plural} × {each:g} {unit}{'s' if each != 1 else ''}"


def shortfall(placed: list[Role], nodes: list[dict[str, float]]) -> str | None:
    """Why `placed` does not fit the live nodes' resources (each a dict like Ray's, {"CPU": 8,
    "GPU": 4, ...}), or None when it does: the cluster's totals first, then whether each
    bundle finds a node (first fit, largest first)."""
    for unit in ("GPU", "CPU"):
        need = sum(r.count * (r.gpus if unit == "GPU" else r.cpus) for r in placed)
        have = sum(node.get(unit, 0) for node in nodes)
        if need > have:
            parts = " + ".join(_counted(r, unit) for r in placed if (r.gpus or unit == "CPU"))
            return (
                f"{parts} need {need:g} {unit}s; the cluster has {have:g} "
                f"({len(nodes)} node{'s' if len(nodes) != 1 else ''})"
            )
    free = [dict(node) for node in nodes]
    bundles = [(r, b) for r in placed for b in r.bundles()]
    bundles.sort(key=lambda rb: (rb[1].get("GPU", 0), rb[1]["CPU"]), reverse=True)
    for role, bundle in bundles:
        home = next((n for n in free if all(n.get(k, 0) >= v for k, v in bundle.items())), None)
        if home is None:
            largest = max((n.get("GPU", 0), n.get("CPU", 0)) for n in nodes)
            wants = " and ".join(f"{v:g} {k}s" for k, v in bundle.items())
            return (
                f"each {role.name} needs {wants} on one node, and no node has that much free "
                f"once the larger ones are placed (the largest node has {largest[0]:g} GPUs "
                f"and {largest[1]:g} CPUs)"
            )
        for k, v in bundle.items():
            home[k] -= v
    return None


def check_launcher(launcher, under_torchrun: bool) -> None:
    """Refuse launcher settings that cannot work (ConfigError), before anything starts."""
    for key, low in (("learner_ranks", 1), ("cpus_per_rank", 0), ("cpus_per_worker", 0)):
        value = getattr(launcher, key)
        if value < low or (low == 0 and value == 0):
            least = "at least 1" if low else "more than 0"
            raise ConfigError(f"launcher.{key}={value} must be {least}.")
    if launcher.stop_grace_s < 0:
        raise ConfigError(f"launcher.stop_grace_s={launcher.stop_grace_s} must be 0 or more.")
    if launcher.name == "ray" and under_torchrun:
        raise ConfigError(
            "launcher=ray starts the learner's ranks itself (launcher.learner_ranks), so it runs "
            "as one process, not under torchrun: drop torchrun, or use launcher=local."
        )
    if launcher.name == "local" and launcher.learner_ranks > 1:
        raise ConfigError(
            f"launcher.learner_ranks={launcher.learner_ranks} places ranks on a Ray cluster "
            "(launcher=ray); on this machine start ranks with torchrun --nproc_per_node "
            f"{launcher.learner_ranks} -m rlcli train ... instead."
        )
