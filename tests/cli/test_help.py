"""`rlcli train --help [GROUP]`: every field under the comment written above it in conf/, read by
`rlcli.config.comments`; and `rlcli --version`."""

import dataclasses
import re
from importlib.metadata import version

import pytest

from rlcli.cli import help_request, main
from rlcli.config import CONF_DIR, Config
from rlcli.config.comments import base_comments, file_header, read_comments

CONF_FILE = """\
# What this file is (its header).
# A second line of it.

# The name.
name: demo
defaults:
  - _self_
# A section.
lora:
  # Its rank; 0 = off.
  rank: 0

  # Ended by the blank line above: not rank's.
  alpha: 32
plain: 1  # no comment line above
"""


def test_comments_are_read_from_the_lines_above_each_key(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text(CONF_FILE)
    found = read_comments(path, "model.")
    assert list(found) == ["model.name", "model.lora", "model.lora.rank", "model.lora.alpha",
                           "model.plain"]  # fmt: skip
    name = found["model.name"]
    assert (name.comment, name.default, name.file, name.line) == ("The name.", "demo", path, 5)
    assert found["model.lora"].default == {"rank": 0, "alpha": 32}
    assert found["model.lora.rank"].comment == "Its rank; 0 = off."
    assert found["model.lora.alpha"].comment == "Ended by the blank line above: not rank's."
    assert found["model.plain"].comment == ""
    assert file_header(path) == "What this file is (its header).\nA second line of it."


def leaf_fields(node, prefix=""):
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if dataclasses.is_dataclass(value):
            yield from leaf_fields(value, f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}"


def test_every_field_of_the_schema_has_a_comment_in_conf():
    docs = base_comments()
    undocumented = [
        key for key in leaf_fields(Config()) if key not in docs or not docs[key].comment
    ]
    assert undocumented == []
    assert docs["algo.name"].comment == "The choice's name, shown in logs and summaries."
    assert docs["trainer.lr"].file.name == "config.yaml" and docs["trainer.lr"].default == 1e-5


def test_help_prints_each_field_under_its_comment(capsys):
    main(["train", "--help"])
    out = capsys.readouterr().out
    assert "  # AdamW learning rate.\n  lr: 1.0e-05\n" in out
    assert (
        "  # Upper clip width; read by clip=decoupled and clip=dcpo only.\n  eps_high: 0.2\n" in out
    )
    assert "    # Rank r of each adapter; 0 = no LoRA (full fine-tuning).\n    rank: 0\n" in out
    assert "model: smollm2_135m, tiny\n" in out and "recipe: dapo_qwen32b, " in out
    assert "rlcli train --help GROUP" in out and "Examples:" in out


@pytest.mark.parametrize("spelling", [["--help", "algo"], ["--help=algo"], ["-h", "algo"]])
def test_help_for_one_group(capsys, spelling):
    main(["train", "algo=dapo", *spelling])
    out = capsys.readouterr().out
    assert out.startswith("rlcli train --help algo: the algo group.")
    first_line = file_header(CONF_DIR / "algo" / "grpo.yaml").splitlines()[0]
    assert f"  grpo                   {first_line}\n" in out
    assert "* dapo                   DAPO (Yu et al. 2025): " in out  # the choice in use
    assert "algo.advantage (or your own" in out  # the estimators and losses, for algo
    # Each field: its own comment, then why the choice sets it as it does.
    assert "  # Upper clip width; read by clip=decoupled and clip=dcpo only.\n" \
           "  # algo=dapo: DAPO eps_high.\n  eps_high: 0.28\n" in out  # fmt: skip
    assert "\ntrainer:" not in out and "\nreward:" not in out


def test_help_for_a_section_and_a_bad_topic(capsys):
    main(["train", "--help", "trainer"])
    out = capsys.readouterr().out
    assert "\ntrainer:\n" in out and "\nalgo:" not in out
    with pytest.raises(SystemExit) as done:
        main(["train", "--help", "algos"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'algos' is not a group or section of the config" in err


def test_help_request_tells_a_topic_from_an_override():
    assert help_request(["--help", "algo", "a=1"]) == (True, "algo", ["a=1"])
    assert help_request(["a=1", "--help", "model=tiny"]) == (True, None, ["a=1", "model=tiny"])
    assert help_request(["-m", "a=1,2"]) == (False, None, ["-m", "a=1,2"])


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_names_rlcli_and_the_libraries_it_runs_on(capsys, flag):
    main([flag])
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    match = re.fullmatch(r"rlcli (\S+) \(torch (\S+), vllm ([^,]+), transformers (\S+)\)\n", out)
    assert match, out
    assert match[1] == version("rlcli") and match[2] == version("torch")
    assert match[4] == version("transformers")
