"""`rlcli train launcher=ray`: one command places a run's processes on a Ray cluster.

The launcher (this process) joins the cluster (`join`), checks that the run fits it before
anything loads (`placement.shortfall`), and reserves one placement group: a bundle per learner
rank and per rollout worker. In each bundle a `ProcessHost` actor starts the process that
would run there by hand: `rlcli rollout-server` for each of the `sampler.workers` rollout
workers, then `rlcli train` for each learner rank, with torchrun's variables (rank 0's node as
the rendezvous) and the workers' URLs, the same run directory (storage every node sees) and
`launcher=local`, so that a rank is exactly what torchrun starts (docs/scaling.md, "On a Ray
cluster"). Rank 0's output is this process's output; the others' go to
`launch/rank_<i>.log` and the workers' to `launch/worker_<j>.log` in the run directory.

The run ends as a local one does: a Ctrl-C lets the ranks finish the step and save; a rank's
error or a lost worker ends the run with its own message and exit code, which the launcher
takes as its own; a rank lost with its node ends the others, and the launcher says what was
lost and how to resume. Nothing of the run is left on the cluster: its actors end, their
processes with them, and the placement group is removed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from rlcli.config import Config, ConfigError
from rlcli.launch.hosts import STDERR, ProcessHost
from rlcli.launch.placement import roles, shortfall
from rlcli.lifecycle.guard import (
    EXIT_CODES,
    EXIT_WORKER_LOST,
    RESUME_COMMAND_VARIABLE,
    RunStopped,
    resume_command,
)
from rlcli.lifecycle.run_dir import RUN_DIR_HELD_VARIABLE
from rlcli.rollout.workers.client import is_up

# The command's overrides a rank or worker is not given: the launcher's own, and those the
# launcher sets for it (a key given twice is an error to Hydra).
LAUNCHER_KEYS = ("launcher=", "launcher.", "hydra.run.dir=")
SET_FOR_RANKS = ("sampler.workers=", "sampler.urls=", "sampler.transfer_address=")
SET_FOR_WORKERS = ("sampler.serve_port=",)


def _ray():
    try:
        import ray
    except ImportError:
        raise ConfigError(
            'launcher=ray needs Ray, which is not installed: pip install -e ".[ray]" (Ray 2.40 '
            "to 2.60), or run on this machine with launcher=local."
        ) from None
    return ray


def _unreachable(address: str | None) -> str | None:
    """Why the head at HOST:PORT (`address`, else RAY_ADDRESS) does not answer, or None: Ray
    itself retries for minutes, writing a line every few seconds, before it gives up."""
    given = address or os.environ.get("RAY_ADDRESS")
    if not given or given in ("auto", "local") or "://" in given:
        return None  # a new cluster, the one on this node (Ray says so at once), Ray Client
    host, _, port = given.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=10):
            return None
    except ValueError:
        return f"{given!r} is not HOST:PORT"
    except OSError as err:
        return f"nothing answers at {given} ({err.strerror or err})"


def join(address: str | None):
    """Connect to the cluster at `address` (launcher.address), or start one here; Ray's own
    log lines are kept off the console."""
    ray = _ray()
    why = _unreachable(address)
    if why is None:
        try:
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
                configure_logging=True,
            )
            return ray
        except (ConnectionError, RuntimeError, ValueError) as err:
            where = address or os.environ.get("RAY_ADDRESS", "a new local cluster")
            why = f"{where}: {err}"
    raise ConfigError(
        f"launcher.address={address}: no Ray cluster could be joined: {why}. Start one "
        "(`ray start --head` on the head node) and give its HOST:PORT, auto (the one on "
        "this node), or null to start one on this machine."
    )


def _on_gpu(device: str, cluster: dict) -> bool:
    """Whether the ranks and workers hold GPUs: trainer.device=cuda, or auto on a cluster
    that has some."""
    return device.startswith("cuda") or (device == "auto" and cluster.get("GPU", 0) > 0)


def _passed_on(overrides: list[str], set_here: tuple[str, ...] = ()) -> list[str]:
    """The command's overrides a rank or worker is also given: not the launcher's own, nor
    those in `set_here`, which the launcher sets for it."""
    return [o for o in overrides if not o.lstrip("+~").startswith((*LAUNCHER_KEYS, *set_here))]


def launch(cfg: Config, run_dir: Path, overrides: list[str]) -> None:
    """Run `rlcli train` with `overrides` on the cluster `cfg.launcher` names; exits with the
    code of the run's rank 0 (SystemExit) when it is not 0."""
    ray = join(cfg.launcher.address)
    group, hosts = None, []
    try:
        on_gpu = _on_gpu(cfg.trainer.device, ray.cluster_resources())
        k, lc = (0 if cfg.sampler.urls else cfg.sampler.workers), cfg.launcher
        placed = roles(lc.learner_ranks, lc.cpus_per_rank, k, lc.cpus_per_worker,
                       cfg.sampler.tensor_parallel_size, on_gpu)  # fmt: skip
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        if (why := shortfall(placed, nodes)) is not None:
            raise ConfigError(
                f"launcher=ray: {why}. Lower launcher.learner_ranks, sampler.workers or "
                "launcher.cpus_per_rank / cpus_per_worker, or add nodes to the cluster."
            )
        group, hosts = _place(ray, [b for role in placed for b in role.bundles()])
        n = cfg.launcher.learner_ranks
        ranks, workers = hosts[:n], hosts[n:]
        ips = _where(ray, ranks, workers, run_dir)
        worker_overrides = _passed_on(overrides, SET_FOR_WORKERS)
        urls = _start_workers(ray, workers, ips[n:], cfg, run_dir, worker_overrides)
        given = _passed_on(overrides, SET_FOR_RANKS if urls else ())
        _start_ranks(ray, ranks, ips[:n], cfg, run_dir, given, urls, on_gpu)
        code = _watch(ray, ranks, cfg.launcher.stop_grace_s, run_dir)
    finally:
        _clear(ray, hosts, group)
    if code:
        raise SystemExit(code)


def _place(ray, bundles: list[dict]):
    """The run's placement group, and a `ProcessHost` actor in each of its bundles."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group(bundles, strategy="PACK", name="rlcli")
    ray.get(group.ready(), timeout=120)
    host = ray.remote(ProcessHost)
    hosts = [
        host.options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, i),
        ).remote()
        for i, bundle in enumerate(bundles)
    ]
    return group, hosts


def _where(ray, ranks, workers, run_dir: Path) -> list[str]:
    """Say where each process was placed, on the console and in launch/placement.json; returns
    the IP address of each one's node, ranks first."""
    names = [f"rank {i}" for i in range(len(ranks))] + [f"worker {j}" for j in range(len(workers))]
    nodes = ray.get([h.node.remote() for h in [*ranks, *workers]])
    placed = [{"process": name, "ip": ip, "node": node}
              for name, (ip, node) in zip(names, nodes, strict=True)]  # fmt: skip
    (run_dir / "launch").mkdir(parents=True, exist_ok=True)
    (run_dir / "launch" / "placement.json").write_text(json.dumps(placed, indent=1) + "\n")
    ids = list(dict.fromkeys(node for _, node in nodes))  # nodes numbered as first met
    where = ", ".join(f"{p['process']} on node {ids.index(p['node'])} ({p['ip']})" for p in placed)
    print(f"rlcli: placed on the Ray cluster: {where}; logs in {run_dir / 'launch'}")
    return [ip for ip, _ in nodes]


def _threads(cpus: float) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(max(1, int(cpus)))}


def _start_workers(ray, workers, ips: list[str], cfg: Config, run_dir: Path,
                   passed: list[str]) -> list[str]:  # fmt: skip
    """`rlcli rollout-server` in each worker's bundle (on the nodes at `ips`); their URLs once
    each answers."""
    ports = ray.get([w.free_port.remote() for w in workers])
    for j, (worker, port) in enumerate(zip(workers, ports, strict=True)):
        own = run_dir / "launch" / f"worker_{j}"  # its Hydra directory
        argv = [sys.executable, "-m", "rlcli", "rollout-server", *passed,
                f"sampler.serve_port={port}", f"hydra.run.dir={own}"]  # fmt: skip
        log = str(run_dir / "launch" / f"worker_{j}.log")
        ray.get(worker.start.remote(argv, _threads(cfg.launcher.cpus_per_worker), os.getcwd(),
                                    log, False))  # fmt: skip
    urls = [f"http://{ip}:{port}" for ip, port in zip(ips, ports, strict=True)]
    deadline = time.monotonic() + cfg.sampler.worker_timeout_s
    for j, (worker, url) in enumerate(zip(workers, urls, strict=True)):
        while not is_up(url):
            log = run_dir / "launch" / f"worker_{j}.log"
            if (code := ray.get(worker.poll.remote())) is not None:
                why = f"exited with code {code} while starting; the end of {log} says why"
            elif time.monotonic() > deadline:
                limit = cfg.sampler.worker_timeout_s
                why = f"did not answer within sampler.worker_timeout_s={limit:g} s; see {log}"
            else:
                time.sleep(1)
                continue
            raise RunStopped(
                f"rollout worker {j} ({url}) {why} (out of memory is the usual cause). Nothing "
                f"was trained; once it can start, run again with:\n  {resume_command(run_dir)}",
                EXIT_WORKER_LOST,
            )
    return urls


def _start_ranks(ray, ranks, ips: list[str], cfg: Config, run_dir: Path, passed: list[str],
                 urls: list[str], on_gpu: bool) -> None:  # fmt: skip
    """`rlcli train` in each rank's bundle (on the nodes at `ips`), with torchrun's variables:
    rank 0's node is the rendezvous and the address the workers reach for the weight push."""
    port = ray.get(ranks[0].free_port.remote())
    given = [*passed, "launcher=local", f"hydra.run.dir={run_dir}"]
    if urls:
        given += ["sampler.workers=0", f"sampler.urls=[{','.join(urls)}]",
                  f"sampler.transfer_address={ips[0]}"]  # fmt: skip
    command = resume_command(run_dir)  # the launcher's: launcher=ray, its overrides
    for i, (rank, ip) in enumerate(zip(ranks, ips, strict=True)):
        env = {
            "RANK": str(i),
            "WORLD_SIZE": str(len(ranks)),
            # Ray shows a rank only its own GPU, so each is device 0 of its process.
            "LOCAL_RANK": "0" if on_gpu else str(ips[:i].count(ip)),
            "LOCAL_WORLD_SIZE": str(ips.count(ip)),
            "MASTER_ADDR": ips[0],
            "MASTER_PORT": str(port),
            RUN_DIR_HELD_VARIABLE: "1",  # the launcher holds the run directory's lock
            RESUME_COMMAND_VARIABLE: command,
            **_threads(cfg.launcher.cpus_per_rank),
        }
        argv = [sys.executable, "-m", "rlcli", "train", *given]
        log = str(run_dir / "launch" / f"rank_{i}.log")
        ray.get(rank.start.remote(argv, env, os.getcwd(), log, i == 0))


def _relay(chunks) -> None:
    """Rank 0's output, as it wrote it (its progress bar's carriage returns too), on this
    process's own descriptors: rank 0 copies it into the run's log already."""
    for stream, data in chunks:
        os.write(2 if stream == STDERR else 1, data)


def _watch(ray, ranks, grace: float, run_dir: Path) -> int:
    """Relay rank 0's output until every rank has ended; pass a Ctrl-C (or SIGTERM) on to the
    ranks, which finish the step and save; end the others when a rank is lost. Returns the
    exit code the launcher takes: rank 0's, or the lost rank's report's."""
    from ray.exceptions import RayActorError

    asked: list[int] = []  # the signals this process received, to pass on

    def ask(signum, frame) -> None:
        asked.append(signum)

    previous = {sig: signal.signal(sig, ask) for sig in EXIT_CODES}
    try:
        deadline, passed = None, 0
        while True:
            if len(asked) > passed:  # a second one kills at once
                for rank in ranks:
                    rank.send.remote(asked[-1])
                passed = len(asked)
                deadline = time.monotonic() + (grace if passed == 1 else 0)
            try:
                codes = ray.get([r.poll.remote() for r in ranks])
                _relay(ray.get(ranks[0].output.remote()))
            except RayActorError:
                return _rank_lost(ray, ranks, grace, run_dir)
            failed = [c for c in codes if c not in (None, 0)]
            if all(code is not None for code in codes):
                return codes[0] or (failed[0] if failed else 0)
            if failed and deadline is None:
                # A rank that failed leaves the others waiting for it in their next collective.
                deadline = time.monotonic() + min(grace, 30)
            if deadline is not None and time.monotonic() > deadline:
                ray.get([r.end.remote(0) for r in ranks])
                _relay(ray.get(ranks[0].output.remote()))
                return EXIT_CODES.get(asked[0], 1) if asked else failed[0]
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _rank_lost(ray, ranks, grace: float, run_dir: Path) -> int:
    """A rank's actor is gone (its node left the cluster, or its process was killed): the
    others would wait for it in their next collective, so they are ended too."""
    from ray.exceptions import RayActorError

    lost = []
    for i, rank in enumerate(ranks):
        try:
            ray.get(rank.poll.remote())
        except RayActorError:
            lost.append(i)
    for i, rank in enumerate(ranks):
        if i not in lost:
            try:
                ray.get(rank.end.remote(min(grace, 10)))
            except RayActorError:
                pass
    print(
        f"\nrlcli: learner rank(s) {', '.join(map(str, lost))} were lost (the node left the "
        "Ray cluster, or the process was killed), so the run stopped; the other ranks were "
        f"ended. The checkpoints written so far are in {run_dir / 'checkpoints'}; once the "
        f"cluster has room again, resume with:\n  {resume_command(run_dir)}",
        file=sys.stderr,
    )
    return 1


def _clear(ray, hosts, group) -> None:
    """End every process of the run and its actors, remove its placement group, and leave the
    cluster (one started here ends with it)."""
    from ray.util.placement_group import remove_placement_group

    for host in hosts:
        try:
            ray.get(host.end.remote(5), timeout=30)
        except Exception:  # an actor already gone with its node: nothing of it to end
            pass
        ray.kill(host)
    if group is not None:
        remove_placement_group(group)
    ray.shutdown()
