"""`rlcli export` on the console: rlcli's lines, not the progress bars of the libraries it
loads and writes the model with. (What it writes: tests/runtime/test_lora.py.)"""

from rlcli.cli import main


def test_export_prints_its_lines_and_no_progress_bars(tiny_model_dir, tmp_path, capsys):
    main(["export", tiny_model_dir, str(tmp_path / "out")])
    console = capsys.readouterr()
    assert console.out == (
        f"rlcli: wrote a Hugging Face model to {tmp_path / 'out'} "
        f"(load it with model.path={tmp_path / 'out'})\n"
    )
    assert console.err == ""  # before: "Loading weights" and "Writing model shards" bars
