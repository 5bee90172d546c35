"""scripts/cfg_walk.py on a tiny package written for the test: the stays it must find, in
depth-first order, their rooms, the climbs back up, and the lower room given the whole Config."""

import subprocess
import sys
from pathlib import Path
from textwrap import dedent

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import cfg_walk  # noqa: E402

PACKAGE = {
    "__init__.py": "",
    "config/__init__.py": "",
    "config/schema.py": """
        from dataclasses import dataclass

        @dataclass
        class SamplerConfig:
            temperature: float = 1.0

        @dataclass
        class TrainerConfig:
            lr: float = 0.1

        @dataclass
        class Config:
            sampler: SamplerConfig
            trainer: TrainerConfig
    """,
    "train/__init__.py": "",
    # The entry: hands the whole config down, a section and a leaf across, and to a function
    # held in a dataclass field, whose return value carries it on; `log` gets none of it.
    "train/loop.py": """
        from dataclasses import dataclass

        from rlcli.config.schema import Config
        from rlcli.rollout.engine import make_sampler
        from rlcli.train import helpers

        @dataclass
        class Trainer:
            setup: object

        TRAINERS: dict[str, Trainer] = {"rl": Trainer(setup=helpers.start)}

        def train(cfg: Config, run_dir) -> None:
            t, trainer = cfg.trainer, TRAINERS["rl"]
            helpers.prepare(cfg)
            sampler = make_sampler(cfg.sampler, lr=t.lr)
            helpers.log(run_dir, sampler)
            run = trainer.setup(cfg)
            helpers.finish(run)
            print(cfg)  # a library call: not followed
    """,
    "train/helpers.py": """
        from dataclasses import dataclass

        from rlcli.rollout.engine import warm_up

        @dataclass
        class Run:
            cfg: object
            step: int

        def start(cfg):
            return Run(cfg, 0)  # carries the whole Config in its field `cfg`

        def prepare(cfg):
            warm_up(cfg)
            remember(cfg.trainer)

        def remember(trainer):
            return trainer.lr

        def log(run_dir, sampler):
            pass

        def finish(run):
            warm_up(run.cfg)  # a second visit: no new stay, still a hand-off of it all
    """,
    "rollout/__init__.py": "",
    "rollout/engine.py": """
        def warm_up(cfg):
            check(cfg.sampler.temperature)

        def check(value):
            return value > 0

        def make_sampler(sampler, lr):
            return Engine(sampler)

        class Engine:
            def __init__(self, sampler):
                self.sampler = sampler
    """,
}


def walk_of(tmp_path: Path) -> cfg_walk.Walk:
    for name, text in PACKAGE.items():
        path = tmp_path / "rlcli" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text))
    return cfg_walk.Walk(cfg_walk.Index(tmp_path / "rlcli"))


def test_the_stays_in_depth_first_order(tmp_path):
    stays = [(s["function"], s["room"], s["holds"]) for s in walk_of(tmp_path).stays]
    assert stays == [
        ("rlcli.train.loop.train", "train", "whole"),
        ("rlcli.train.helpers.prepare", "train", "whole"),
        ("rlcli.rollout.engine.warm_up", "rollout", "whole"),
        ("rlcli.rollout.engine.check", "rollout", "leaf"),
        ("rlcli.train.helpers.remember", "train", "section"),
        ("rlcli.rollout.engine.make_sampler", "rollout", "section"),
        ("rlcli.rollout.engine.Engine.__init__", "rollout", "section"),
        ("rlcli.train.helpers.start", "train", "whole"),
        ("rlcli.train.helpers.finish", "train", "whole"),
    ]


def test_what_each_stay_holds(tmp_path):
    how = {s["function"].rpartition(".")[2]: s["how"] for s in walk_of(tmp_path).stays}
    assert how["check"] == ["value=sampler.temperature"]
    assert how["make_sampler"] == ["sampler=sampler"]  # lr=trainer.lr is a weaker leaf
    assert how["remember"] == ["trainer=trainer"]
    assert how["finish"] == ["run.cfg=cfg"]  # the whole Config, in the field start filled


def test_rooms_modules_and_climbs(tmp_path):
    counts = cfg_walk.counts(walk_of(tmp_path))
    assert counts == {"stays": 9, "window": 9, "rooms": 2, "modules": 3, "climbs": 2}
    # Only the first stays count: train, train, rollout, rollout enter 2 rooms and never climb.
    assert cfg_walk.counts(walk_of(tmp_path), window=4)["climbs"] == 0
    assert cfg_walk.counts(walk_of(tmp_path), window=5)["climbs"] == 1


def test_the_lower_room_given_the_whole_config(tmp_path):
    below = list(walk_of(tmp_path).whole_below.values())
    assert [(w["function"], w["at"], w["as"], w["from"]) for w in below] == [
        ("rlcli.rollout.engine.warm_up", "rlcli/rollout/engine.py:2", ["cfg"],
         "rlcli.train.helpers.prepare"),
    ]  # fmt: skip


def test_the_script_runs_on_rlcli_and_exits_0():
    script = REPO / "scripts" / "cfg_walk.py"
    out = subprocess.run([sys.executable, str(script), "--quiet"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "rooms" in out.stdout and "climbs back up" in out.stdout
