"""A disk that fills up while the tokenizer is written, after the model's weights: the
tokenizers library reports it as a plain Exception ("No space left on device (os error 28)"),
not an OSError. A checkpoint then fails as any write does (one paragraph, nothing left
behind), and `rlcli export` exits 2 leaving no model beside a cut-short tokenizer.json."""

import shutil
import subprocess
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlcli.cli import main
from rlcli.lifecycle.checkpoint import CheckpointWriteError, save_checkpoint


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A disk with room for the tiny model's weights (12.9 MB) but not its tokenizer.json
    (3.5 MB more): a real 15 MiB tmpfs where this user may mount one (root). Elsewhere it is
    simulated: the tokenizer's save writes the start of tokenizer.json and raises what the
    tokenizers library raises on a full disk (checked on a real tmpfs)."""
    path = tmp_path / "disk"
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=15m", "rlcli-test", str(path)]
    if shutil.which("mount") and subprocess.run(mount, capture_output=True).returncode == 0:
        yield path
        subprocess.run(["umount", "-l", str(path)], check=True)
        return

    def full(self, directory, *args, **kwargs):
        (Path(directory) / "tokenizer.json").write_text('{"version": "1.0", "trunc')
        raise Exception("No space left on device (os error 28)")  # noqa: TRY002 - as tokenizers does

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full)
    yield path


def test_a_checkpoint_whose_tokenizer_does_not_fit_is_a_clear_error(tiny_model_dir, disk):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(CheckpointWriteError) as err:  # before: the tokenizers Exception
        save_checkpoint(disk / "run", 1, model, tokenizer, {}, {})
    assert str(err.value).startswith(
        f"could not write checkpoint step_1 in {disk / 'run' / 'checkpoints'}: the tokenizer "
        "could not be written: No space left on device (os error 28)."
    )
    assert list((disk / "run" / "checkpoints").iterdir()) == []  # no partial directory


def test_export_whose_tokenizer_does_not_fit_exits_2_and_leaves_nothing(
    tiny_model_dir, disk, capsys
):
    out = disk / "out"
    with pytest.raises(SystemExit) as exit_:  # before: a traceback, and a model left in out
        main(["export", tiny_model_dir, str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"rlcli: error: {out} cannot be written: No space left on device (os error 28). Nothing "
        "was exported and the checkpoint is unchanged; name a directory on a writable disk with "
        "room for the model.\n"
    )
    assert not out.exists()  # export made it, so it takes it away again
