"""The `rlcli` command line as Hydra users type it: flags (-m, --cfg, --help) in any position,
and the job log (train.log) that holds what the console showed and what was kept off it."""

import logging
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from rlcli.cli import main
from rlcli.config.overrides import split_flags
from rlcli.tracking import console as console_log
from rlcli.tracking.console import job_log
from tests.conftest import REPO, tiny

TINY = tiny("trainer.max_steps=1")


@pytest.mark.parametrize(
    ("argv", "flags", "overrides"),
    [
        (["algo=grpo,dapo", "-m"], ["-m"], ["algo=grpo,dapo"]),
        (["a=1", "--cfg", "job", "b=2"], ["--cfg", "job"], ["a=1", "b=2"]),
        (["--info", "defaults", "a=1"], ["--info", "defaults"], ["a=1"]),
        (["--info", "a=1"], ["--info"], ["a=1"]),
        (["a=1", "--help"], ["--help"], ["a=1"]),
        (["~trainer.x", "-cn", "other"], ["-cn", "other"], ["~trainer.x"]),
    ],
)
def test_flags_are_told_from_overrides(argv, flags, overrides):
    assert split_flags(argv) == (flags, overrides)


@pytest.mark.parametrize("position", ["after", "between", "before"])
def test_cfg_job_works_in_any_position(capsys, position):
    argv = {
        "after": ["recipe=cpu/dapo_qwen32b", "trainer.max_steps=3", "--cfg", "job"],
        "between": ["recipe=cpu/dapo_qwen32b", "--cfg", "job", "trainer.max_steps=3"],
        "before": ["--cfg", "job", "recipe=cpu/dapo_qwen32b", "trainer.max_steps=3"],
    }[position]
    main(["train", *argv])
    out = capsys.readouterr().out
    assert "name: dapo" in out and "max_steps: 3" in out


def test_help_after_a_recipe(capsys):
    main(["train", "recipe=cpu/dapo_qwen32b", "--help"])
    out = capsys.readouterr().out
    assert "rlcli train: reinforcement-learning post-training" in out
    assert "\nalgo:\n  # The choice's name, shown in logs and summaries.\n  name: dapo\n" in out


def test_help_lists_every_loss_and_estimator_from_its_declaration(capsys):
    from rlcli.ops.advantages import ADVANTAGES
    from rlcli.ops.losses import LOSSES

    main(["train", "--help"])
    out = capsys.readouterr().out
    for name, piece in [*LOSSES.items(), *ADVANTAGES.items()]:
        assert f"  {name:22} {piece.doc}" in out, name
    assert "[settings: tau_pos=1.0, tau_neg=1.05]" in out  # sapo's, from its signature
    assert "gmpo                   GMPO" in out and "[needs: response_advantage]" in out


def test_a_sweep_with_m_at_the_end(tmp_path):
    main(["train", *TINY, "algo=grpo,dr_grpo", "-m", f"hydra.sweep.dir={tmp_path}"])
    # Each job's directory is named by what varies across the sweep, not by every override.
    jobs = sorted(p.name for p in tmp_path.iterdir() if (p / "metrics.jsonl").is_file())
    assert jobs == ["0_algo=grpo", "1_algo=dr_grpo"]
    assert "| [1](<1_algo=dr_grpo>) | algo=dr_grpo | 1 |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "summary.png").is_file()


def test_the_job_log_holds_the_console_and_the_chatter_kept_off_it(tmp_path, capsys, monkeypatch):
    # A library logger of the test's own, so that no other test's logging settings touch it.
    libraries = (*console_log.LIBRARY_LOGGERS, "a_library")
    monkeypatch.setattr(console_log, "LIBRARY_LOGGERS", libraries)
    notices = logging.getLogger("a_library.platforms")
    notices.setLevel(logging.WARNING)
    path = tmp_path / "train.log"
    with job_log(path):
        print("rlcli: a line of rlcli's")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's deprecation notice", FutureWarning, stacklevel=1)
        notices.warning("a NUMA notice")
        sys.stderr.write("step 1/2\rstep 2/2\n")  # a progress bar redrawn with \r
    console = capsys.readouterr()
    assert "rlcli: a line of rlcli's" in console.out and "step 2/2" in console.err
    assert "deprecation notice" not in console.err and "NUMA" not in console.err
    log = path.read_text()
    for line in ("rlcli: a line of rlcli's", "a library's deprecation notice", "a NUMA notice",
                 "step 2/2"):  # fmt: skip
        assert line in log
    assert "step 1/2" not in log


def test_train_log_holds_what_the_run_printed(tmp_path):
    main(["train", *TINY, f"hydra.run.dir={tmp_path}"])
    log = (tmp_path / "train.log").read_text()
    assert "rlcli: training " in log and "rlcli: metrics in" in log


def test_a_hub_id_loads_the_models_weights_from_the_hub_cache(tmp_path, tiny_model_dir):
    # The hub cannot be reached here: a local directory in the hub cache's layout stands in
    # for it (what `huggingface_hub` downloads `org/name` to), read offline.
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--rlcli-tests--tiny-hub"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(tiny_model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "rlcli", "train", *TINY, "model.source=hub",
               "model.path=rlcli-tests/tiny-hub", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "rlcli: training rlcli-tests/tiny-hub on cpu" in out.stdout


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("trainer.lr=[1,", "no viable alternative at input '[1,'"),
        ("trainer", "missing EQUAL at '<EOF>'"),
        ("algo=grpo)", "extraneous input ')' expecting <EOF>"),
    ],
)
def test_an_override_hydra_cannot_parse_exits_2_in_one_paragraph(tmp_path, capsys, override, why):
    # Hydra reports these itself with exit code 1; rlcli reads them first.
    with pytest.raises(SystemExit) as done:
        main(["train", *TINY, override, f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"rlcli: error: {override!r} is not a valid override ({why}). ")
    assert "key=[a,b]" in err and "override_grammar" in err
    assert not (tmp_path / "run").exists()
