"""A run never ends with exit 0 having lost or mixed results: resumes that refuse a changed
run, checkpoints verified before they are trusted, saves that fail cleanly, only rlcli's own
directories deleted. Runs use the tiny random model, in this process. The lock, foreign
directories, full and read-only disks are tried on the real CLI by scripts/bad_input.py
(tests/cli/test_bad_input.py)."""

import json
import resource
import shutil
import signal
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rlcli.config import ConfigError, config_dict
from rlcli.lifecycle.checkpoint import IN_PROGRESS, damage, list_checkpoints
from rlcli.lifecycle.run_dir import kind_of_field, resume_changes
from rlcli.tracking.metrics import read_metrics
from rlcli.train import loop
from rlcli.train.loop import train
from rlcli.validate import compose
from tests.conftest import tiny

TINY = tiny("trainer.save_every=1", "trainer.keep_last=null")


def cli(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "rlcli", "train", *TINY, *overrides, f"hydra.run.dir={run_dir}"]


def no_traceback(out) -> str:
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text
    return out.stderr.strip().splitlines()[-1]


def test_only_what_rlcli_marked_in_progress_is_deleted(tmp_path):
    train(compose([*TINY, "trainer.max_steps=1"]), tmp_path)
    root = tmp_path / "checkpoints"
    (root / ".mine").mkdir()
    (root / ".mine" / "keep.txt").write_text("not rlcli's")
    (root / ".step_2-interrupted").mkdir()
    (root / ".step_2-interrupted" / IN_PROGRESS).touch()
    # Killed between mkdtemp and marking: empty, with the name only rlcli gives.
    (root / ".step_3-k1lled_").mkdir()
    (root / ".step_notmine").mkdir()
    train(compose([*TINY, "trainer.max_steps=2"]), tmp_path)
    assert (root / ".mine" / "keep.txt").is_file()
    assert (root / ".step_notmine").is_dir()
    assert not (root / ".step_2-interrupted").exists()
    assert not (root / ".step_3-k1lled_").exists()
    # Checkpoints are as readable as the user's other files (umask 022 here: 0644 / 0755).
    step = root / "step_2"
    assert step.stat().st_mode & 0o777 == 0o755
    assert (step / "model.safetensors").stat().st_mode & 0o777 == 0o644


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("base") / "run"
    train(compose([*TINY, "trainer.max_steps=3"]), run_dir)
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.parametrize(
    ("overrides", "listed"),
    [
        (["model.tiny_hidden=32"], "model.tiny_hidden: 64 -> 32"),
        (["algo=ppo"], "algo.advantage: 'grpo' -> 'gae'"),
        (["trainer.group_size=2"], "trainer.group_size: 4 -> 2"),
        (["data.difficulty=3"], "data.difficulty: 2 -> 3"),
    ],
    ids=["model", "algorithm", "group size", "data"],
)
def test_a_resume_that_changes_the_run_is_refused(three_steps, tmp_path, overrides, listed):
    run_dir = copy_of(three_steps, tmp_path)
    before = (run_dir / "config.yaml").read_text()
    with pytest.raises(ConfigError) as err:
        train(compose([*TINY, "trainer.max_steps=5", *overrides]), run_dir)
    assert listed in str(err.value)
    assert "hydra.run.dir=NEW" in str(err.value) and "trainer.resume=null" in str(err.value)
    assert (run_dir / "config.yaml").read_text() == before
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_1", "step_2", "step_3"]


def test_a_resume_applies_a_new_learning_rate_and_says_so(three_steps, tmp_path, capsys):
    run_dir = copy_of(three_steps, tmp_path)
    train(compose([*TINY, "trainer.max_steps=5", "trainer.lr=3e-5"]), run_dir)
    out = capsys.readouterr().out
    assert "trainer.lr changed since step 3 (1e-05 -> 3e-05); it applies from step 4." in out
    assert "taken from this command: trainer.max_steps=5" in out
    assert [r["actor/lr"] for r in read_metrics(run_dir)] == [1e-5, 1e-5, 1e-5, 3e-5, 3e-5]
    config = (run_dir / "config.yaml").read_text()
    assert "lr: 3.0e-05" in config and "max_steps: 5" in config
    history = config[config.index("# history") :].splitlines()[1:]
    assert len(history) == 2
    assert "started at step 0" in history[0] and "resumed from" in history[1]


def test_a_finished_run_says_so_before_loading_any_model(three_steps, tmp_path, monkeypatch,
                                                        capsys):  # fmt: skip
    run_dir = copy_of(three_steps, tmp_path)

    def no_model(*_):
        raise AssertionError("a model was loaded for a finished run")

    monkeypatch.setitem(loop.TRAINERS, "clipped", replace(loop.TRAINERS["clipped"], setup=no_model))
    train(compose([*TINY, "trainer.max_steps=3"]), run_dir)
    assert "this run is finished" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "corrupt"),
    [
        ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:1000])),
        ("trainer_state.json", lambda p: p.write_text("{not json")),
        ("optimizer.pt", lambda p: p.write_bytes(p.read_bytes()[:-10])),
    ],
)
def test_a_damaged_newest_checkpoint_is_kept_and_passed_over(three_steps, tmp_path, capsys,
                                                            name, corrupt):  # fmt: skip
    run_dir = copy_of(three_steps, tmp_path)
    corrupt(run_dir / "checkpoints" / "step_3" / name)
    assert name in damage(run_dir / "checkpoints" / "step_3")
    train(compose([*TINY, "trainer.max_steps=4"]), run_dir)
    out = capsys.readouterr().out
    assert f"checkpoint {run_dir}/checkpoints/step_3 is damaged: {name}" in out
    assert "resuming from" in out and "step_2 (step 2)" in out
    kept = run_dir / "checkpoints" / "step_3.damaged"
    assert (kept / name).is_file()  # never deleted
    assert [p.name for p in list_checkpoints(run_dir)] == ["step_1", "step_2", "step_3", "step_4"]
    assert damage(run_dir / "checkpoints" / "step_4") is None


def test_a_write_that_fails_midway_leaves_no_partial_checkpoint(tmp_path):
    # A real failed write: files may grow to 20 MB, so the Adam state (~26 MB) fails with
    # EFBIG after the weights (~13 MB) were written.
    train(compose([*TINY, "trainer.max_steps=1"]), tmp_path)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20 * 2**20, limits[1]))
    try:
        with pytest.raises(ConfigError) as err:
            train(compose([*TINY, "trainer.max_steps=2"]), tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert "could not write checkpoint step_2" in str(err.value)
    assert "The older checkpoints (step_1) are intact." in str(err.value)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_1"]
    assert not list((tmp_path / "checkpoints").glob(".*"))


@pytest.mark.parametrize(
    ("key", "kind"),
    [("trainer.max_steps", "free"), ("eval.k", "free"), ("trainer.lr", "applied"),
     ("algo.beta", "applied"), ("algo.eps_high", "fixed"), ("model.path", "fixed"),
     ("trainer.seed", "fixed"), ("sampler.temperature", "fixed")],
)  # fmt: skip
def test_what_a_resume_may_change(key, kind):
    assert kind_of_field(key) == kind


def test_a_config_saved_with_old_logp_resolved_still_resumes_with_auto():
    # An older rlcli wrote sampler.old_logp=auto into config.yaml as it resolved it.
    cfg = compose(TINY)
    assert cfg.sampler.old_logp == "auto"
    now = config_dict(cfg)
    saved = config_dict(replace(cfg, sampler=replace(cfg.sampler, old_logp="learner")))
    assert resume_changes(saved, now, "learner")["fixed"] == []
    saved = config_dict(replace(cfg, sampler=replace(cfg.sampler, old_logp="sampler")))
    assert resume_changes(saved, now, "learner")["fixed"] == [
        ("sampler.old_logp", "sampler", "learner")
    ]


def test_the_manifest_covers_every_file_of_a_checkpoint(three_steps):
    step = three_steps / "checkpoints" / "step_3"
    files = json.loads((step / "manifest.json").read_text())["files"]
    on_disk = {p.name for p in step.iterdir()} - {"manifest.json"}
    assert set(files) == on_disk
