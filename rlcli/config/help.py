"""The text of `rlcli train --help [TOPIC]`, from a composed config and the comments of conf/.

Without a topic: the header, the groups and their choices, the losses and advantage
estimators, every field of the composed config under its comment, the footer. With a group
(`--help algo`): its choices, each with the first line of its file's comment, and the group's
fields; with a section (`--help trainer`): its fields. The caller composes the config (Hydra)
and passes what the registries say (`describe_pieces`), so this module reads only conf/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.config.comments import commented_yaml, file_header, help_comments
from rlcli.config.overrides import group_choices
from rlcli.config.schema import CONF_DIR, Config, ConfigError

SECTIONS = tuple(Config.__dataclass_fields__)  # algo, reward, ..., trainer, eval, ...
PIECES_TITLE = "Losses and advantage estimators (mix them: algo=grpo algo.loss=cispo)"


@dataclass
class HelpInput:
    """What the help shows: the composed config and what lies outside conf/."""

    values: Mapping[str, Any]  # the composed config without `hydra`, as plain dicts
    chosen: Mapping[str, str]  # each group's choice (hydra.runtime.choices)
    pieces: str  # the losses and estimators, with their settings (train.pieces_help)
    recipes: Sequence[str]  # the choices of recipe=
    header: str = ""  # hydra.help.header
    footer: str = ""  # hydra.help.footer


def check_topic(topic: str | None) -> None:
    if topic is not None and topic not in SECTIONS:
        raise ConfigError(
            f"--help {topic}: {topic!r} is not a group or section of the config; valid: "
            f"{', '.join(SECTIONS)} (rlcli recipes lists the recipes)."
        )


def full_help(given: HelpInput, conf_dir: Path = CONF_DIR) -> list[str]:
    """Everything: the groups, the pieces, the whole config under its comments."""
    groups = group_choices(conf_dir)
    return [
        given.header.rstrip(),
        f"One group or section in detail: rlcli train --help GROUP ({', '.join(SECTIONS)}).",
        "",
        "== Config groups (pick one choice each) ==",
        *(f"{group}: {', '.join(choices)}" for group, choices in groups.items()),
        f"recipe: {', '.join(given.recipes)}",
        "",
        f"== {PIECES_TITLE} ==",
        given.pieces,
        "",
        "== Config (override any field with key=value), each field under its comment ==",
        *commented_yaml(given.values, help_comments(given.chosen, conf_dir)),
        "",
        given.footer.rstrip(),
    ]


def group_help(topic: str, given: HelpInput, conf_dir: Path = CONF_DIR) -> list[str]:
    """One group: its choices, each with its file's first comment line, and its fields."""
    choices, now = group_choices(conf_dir)[topic], given.chosen.get(topic, "")
    width = max(map(len, choices)) + 2
    lines = [
        f"rlcli train --help {topic}: the {topic} group. Pick one choice with {topic}=NAME "
        f"(now {now}, marked *); set a field with {topic}.KEY=VALUE.",
        "",
        "== Choices ==",
    ]
    for choice in choices:
        first = file_header(conf_dir / topic / f"{choice}.yaml").split("\n")[0]
        lines.append(f"{'*' if choice == now else ' '} {choice:{width}}{first}".rstrip())
    if topic == "algo":
        lines += ["", f"== {PIECES_TITLE} ==", given.pieces]
    comments = help_comments(given.chosen, conf_dir)
    return [*lines, "", f"== Fields at {topic}={now} ==",
            *commented_yaml({topic: given.values[topic]}, comments)]  # fmt: skip


def help_text(topic: str | None, given: HelpInput, conf_dir: Path = CONF_DIR) -> str:
    """`rlcli train --help` (topic None), `--help GROUP` or `--help SECTION`."""
    check_topic(topic)
    if topic is None:
        lines = full_help(given, conf_dir)
    elif (conf_dir / topic).is_dir():
        lines = group_help(topic, given, conf_dir)
    else:
        comments = help_comments(given.chosen, conf_dir)
        lines = [
            f"rlcli train --help {topic}: the {topic} section; set a field with {topic}.KEY=VALUE.",
            "",
            *commented_yaml({topic: given.values[topic]}, comments),
        ]
    return "\n".join(lines)
