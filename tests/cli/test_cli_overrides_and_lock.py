"""The command line before Hydra composes: `~key` of rlcli's keys is refused in one line, a
piece's setting is `KEY.NAME=VALUE` with or without `+` whether or not its YAML presets it,
the run directory's lock is taken before Hydra writes into the directory, and
`rlcli train --version` is rlcli's."""

import subprocess
import sys

import pytest

from rlcli.cli import main, version_line
from rlcli.lifecycle.run_dir import claim

TINY = ["model=tiny", "sampler=hf"]


def composed(capsys, *overrides: str) -> str:
    """What `rlcli train ... --cfg job` prints: the composed config, nothing run."""
    main(["train", *TINY, *overrides, "--cfg", "job"])
    return capsys.readouterr().out


@pytest.mark.parametrize("key", ["trainer.lr_scheduler", "trainer.lr_scheduler_kwargs", "algo"])
def test_deleting_one_of_rlclis_keys_exits_2_in_one_line(capsys, key):
    with pytest.raises(SystemExit) as exit_:  # before: MissingMandatoryValue, a traceback
        main(["train", *TINY, f"~{key}", "--cfg", "job"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlcli: error: ~{key} would delete {key}, which every run needs")
    assert err.count("\n") == 1


def test_a_preset_setting_can_still_be_deleted(capsys):
    # sapo's YAML presets tau_pos; deleting it leaves the loss's own default.
    printed = composed(capsys, "algo=sapo", "~algo.loss_settings.tau_pos")
    assert "tau_neg: 1.05" in printed and "tau_pos" not in printed


@pytest.mark.parametrize("plus", ["", "+"])
def test_a_pieces_setting_takes_the_same_form_preset_or_not(capsys, plus):
    # Before: min_lr_rate (no YAML presets it) needed the +, tau_pos (sapo's YAML presets
    # it) refused it; both exited 1 with Hydra's message.
    schedule = "trainer.lr_scheduler=cosine_with_min_lr"
    printed = composed(capsys, schedule, f"{plus}trainer.lr_scheduler_kwargs.min_lr_rate=0.1")
    assert "lr_scheduler_kwargs:\n    min_lr_rate: 0.1" in printed
    printed = composed(capsys, "algo=sapo", f"{plus}algo.loss_settings.tau_pos=2.0")
    assert "loss_settings:\n    tau_pos: 2.0\n    tau_neg: 1.05" in printed


def test_a_run_refused_by_the_lock_leaves_the_running_runs_files_alone(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("algo:\n  name: grpo\n")
    cmd = [sys.executable, "-m", "rlcli", "train", *TINY, "algo=dapo", f"hydra.run.dir={run_dir}"]
    with claim(run_dir, "rlcli train (the running run)"):  # held as a running run holds it
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"rlcli: error: another rlcli run is writing to {run_dir} (PID")
    # Before: Hydra had rewritten it with the refused run's config (algo: dapo) first.
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "algo:\n  name: grpo\n"
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", ".rlcli-run"]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_train_version_is_rlclis(capsys, flag):
    main(["train", flag])  # before: "Hydra 1.3.2"
    assert capsys.readouterr().out == version_line() + "\n"
