"""What a run placed on a Ray cluster holds, and the message when the cluster is too small
(pure: no cluster)."""

import pytest

from rlcli.config import ConfigError
from rlcli.launch.placement import check_launcher, roles, shortfall
from rlcli.validate import compose


def gpus(n: int, cpus: int = 64) -> dict:
    return {"CPU": cpus, "GPU": n}


def test_too_few_gpus_names_each_role_and_the_totals():
    placed = roles(8, 1, 2, 4, tensor_parallel=4, on_gpu=True)
    assert shortfall(placed, [gpus(8), gpus(4)]) == (
        "8 learner ranks × 1 GPU + 2 rollout workers × 4 GPUs need 16 GPUs; the cluster has 12 "
        "(2 nodes)"
    )
    assert shortfall(placed, [gpus(8), gpus(8)]) is None


def test_a_bundle_must_fit_on_one_node():
    # 8 GPUs in all, but a worker of tensor-parallel 8 needs them on one node.
    placed = roles(1, 1, 1, 1, tensor_parallel=8, on_gpu=True)
    too_small = shortfall(placed, [gpus(5), gpus(5)])
    assert too_small.startswith("each rollout worker needs 1 CPUs and 8 GPUs on one node")
    assert shortfall(placed, [gpus(9), gpus(1)]) is None


def test_on_cpu_only_cpus_count():
    placed = roles(2, 1, 1, 1, tensor_parallel=4, on_gpu=False)
    assert [r.bundles() for r in placed] == [[{"CPU": 1}, {"CPU": 1}], [{"CPU": 1}]]
    assert shortfall(placed, [{"CPU": 2}, {"CPU": 1}]) is None
    assert shortfall(placed, [{"CPU": 2}]) == (
        "2 learner ranks × 1 CPU + 1 rollout worker × 1 CPU need 3 CPUs; the cluster has 2 (1 node)"
    )
    # Three CPUs in all, but the second rank of 1.5 finds no node with that much left.
    assert "on one node" in shortfall(roles(2, 1.5, 0, 1, 1, False), [{"CPU": 2}, {"CPU": 1}])
    assert shortfall(roles(2, 1.5, 0, 1, 1, False), [{"CPU": 2}, {"CPU": 2}]) is None


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["launcher=ray", "launcher.learner_ranks=0"], "learner_ranks=0 must be at least 1"),
        (["launcher=ray", "launcher.cpus_per_worker=0"], "launcher.cpus_per_worker=0.0 must be"),
        (["launcher=ray", "launcher.stop_grace_s=-1"], "launcher.stop_grace_s=-1.0 must be 0"),
        (["launcher.learner_ranks=2"], "torchrun --nproc_per_node 2"),
    ],
)
def test_bad_launcher_settings_are_refused_before_anything_starts(overrides, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        compose(overrides)


def test_launcher_ray_is_not_run_under_torchrun():
    cfg = compose(["launcher=ray"])
    with pytest.raises(ConfigError, match="not under torchrun"):
        check_launcher(cfg.launcher, under_torchrun=True)


def test_a_rank_is_given_the_commands_overrides_less_the_launchers():
    from rlcli.launch.ray_run import SET_FOR_RANKS, _passed_on

    command = ["launcher=ray", "launcher.learner_ranks=4", "hydra.run.dir=/runs/a", "algo=dapo",
               "sampler.workers=2", "+sampler.urls=[http://x:1]", "trainer.lr=1e-6"]  # fmt: skip
    assert _passed_on(command) == [
        "algo=dapo", "sampler.workers=2", "+sampler.urls=[http://x:1]", "trainer.lr=1e-6"
    ]  # fmt: skip
    # With workers of its own placing, the launcher names them to the ranks itself.
    assert _passed_on(command, SET_FOR_RANKS) == ["algo=dapo", "trainer.lr=1e-6"]


def test_a_run_on_this_machine_does_not_import_ray():
    # rlcli's own code path (transformers' sampler here: vLLM 0.32 imports Ray itself at its
    # engine's start wherever Ray is installed, in vllm/v1/engine/utils.py).
    import subprocess
    import sys

    from tests.conftest import REPO

    script = (
        "import sys\n"
        "from rlcli.validate import compose\n"
        "from rlcli.train.run import setup\n"
        "from rlcli.train.step import train_step\n"
        "train_step(setup(compose(['model=tiny', 'sampler=hf', 'logger.progress=false'])))\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "[]"
