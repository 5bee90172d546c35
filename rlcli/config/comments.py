"""The comments of conf/: each field is documented once, by the comment lines right above it in
its YAML file. `rlcli train --help` prints them with the config; scripts/make_docs.py builds
the configuration reference from them.

`read_comments` reads one YAML file's keys with their comments and values (`FieldComment`),
`base_comments` every field of the config, `choice_comments` the fields a choice's files set,
`file_header` what a choice is; `commented_yaml` writes a config as YAML, each key under its
comment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlcli.config.schema import CONF_DIR

# Keys of conf/config.yaml that are not config fields: the defaults list and Hydra's own.
NOT_FIELDS = ("defaults", "hydra")


@dataclass(frozen=True)
class FieldComment:
    """One key of a YAML file in conf/."""

    key: str  # dotted, as on the command line: algo.eps_high
    comment: str  # the comment lines right above the key, '#' removed, one per line; "" if none
    default: Any  # the value written there (a dict for a section)
    file: Path
    line: int  # 1-based line of the key


def comment_above(lines: list[str], index: int) -> str:
    """The comment lines right above line `index` (0-based), top first, '# ' removed. A comment
    belongs to the key right below it: a blank line ends it, so a file's header, set off by a
    blank line, is not the first key's comment."""
    found = []
    for line in reversed(lines[:index]):
        text = line.strip()
        if not text.startswith("#"):
            break  # a blank line or a value ends the comment
        found.append(text[1:][1:] if text[1:2] == " " else text[1:])
    return "\n".join(reversed(found))


def read_comments(path: Path, prefix: str = "") -> dict[str, FieldComment]:
    """Every mapping key of the YAML file at `path`, nested ones dotted (`lora.rank`), each
    with the comment right above it; `prefix` ("algo.") goes in front of every key. The
    `defaults` list is left out: it is not a field. PyYAML (a dependency of Hydra's OmegaConf)
    drops comments, so they are read from the text, above the line where PyYAML's parser puts
    each key."""
    text = Path(path).read_text()
    lines = text.splitlines()
    values = yaml.safe_load(text) or {}
    found: dict[str, FieldComment] = {}

    def walk(node, value, dotted: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key_node, value_node in node.value:
            key = f"{dotted}{key_node.value}"
            if not dotted and key_node.value == "defaults":
                continue
            here = value.get(key_node.value) if isinstance(value, dict) else None
            line = key_node.start_mark.line
            comment = comment_above(lines, line)
            found[f"{prefix}{key}"] = FieldComment(f"{prefix}{key}", comment, here, Path(path),
                                                   line + 1)  # fmt: skip
            walk(value_node, here, f"{key}.")

    walk(yaml.compose(text), values, "")
    return found


def file_header(path: Path) -> str:
    """The comment a YAML file opens with, up to its first line that is not a comment; "" when
    the file opens with a key. For a choice's file, what the choice is."""
    header = []
    for line in Path(path).read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:].strip())
    return "\n".join(header).strip()


def groups(conf_dir: Path = CONF_DIR) -> list[str]:
    """The config groups: each folder of conf/ with YAML files, whose base is <group>_base.yaml."""
    return sorted(d.name for d in conf_dir.iterdir() if d.is_dir() and any(d.glob("*.yaml")))


def base_comments(conf_dir: Path = CONF_DIR) -> dict[str, FieldComment]:
    """Every field of the config with its comment and default: conf/config.yaml's sections
    (trainer, eval, filter, pairs) and each group's base file, its keys under the group's
    name (`algo.eps_high` from conf/algo_base.yaml): `conf/<group>_base.yaml` holds all of the
    group's fields."""
    found = {
        key: doc
        for key, doc in read_comments(conf_dir / "config.yaml").items()
        if key.split(".")[0] not in NOT_FIELDS
    }
    for group in groups(conf_dir):
        base = conf_dir / f"{group}_base.yaml"
        if base.is_file():
            found.update(read_comments(base, f"{group}."))
    return found


def choice_chain(group: str, choice: str, conf_dir: Path = CONF_DIR) -> list[Path]:
    """The choice's file, then the files of the same group it starts from (its `defaults`
    entries without a leading '/'), nearest first: dapo.yaml, grpo.yaml."""
    chain, name = [], choice
    while name and (path := conf_dir / group / f"{name}.yaml").is_file() and path not in chain:
        chain.append(path)
        defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
        name = next(
            (d for d in defaults if isinstance(d, str) and d != "_self_" and "/" not in d), None
        )
    return chain


def choice_comments(group: str, choice: str, conf_dir: Path = CONF_DIR) -> dict[str, FieldComment]:
    """The fields `group=choice` sets in its own files (`choice_chain`), each with the comment
    and value of the nearest file that sets it; keys under the group's name."""
    found: dict[str, FieldComment] = {}
    for path in reversed(choice_chain(group, choice, conf_dir)):  # the nearest file wins
        found.update(read_comments(path, f"{group}."))
    return found


def help_comments(choices: Mapping[str, str], conf_dir: Path = CONF_DIR) -> dict[str, str]:
    """Per dotted field, the comment `--help` prints above it: the field's own (from the base
    files), and where the chosen choice sets it to another value with a comment of its own,
    that comment too, after `group=choice:`. A field only a choice has (a loss's settings)
    gets the choice's comment."""
    fields = base_comments(conf_dir)
    comments = {key: doc.comment for key, doc in fields.items()}
    for group, choice in choices.items():
        if not (conf_dir / group).is_dir():
            continue
        for key, own in choice_comments(group, choice, conf_dir).items():
            field = fields.get(key)
            # Every choice sets its own `name`; the base's comment says what it is.
            if not own.comment or key == f"{group}.name":
                continue
            if field is None:
                comments[key] = own.comment
            elif own.default != field.default and own.comment != field.comment:
                comments[key] = f"{field.comment}\n{group}={choice}: {own.comment}".strip()
    return comments


def yaml_value(value: Any) -> str:
    """A value as YAML writes it on one line (lists and maps in flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True)
    return text.removesuffix("\n...\n").strip()


def commented_yaml(
    values: Mapping[str, Any], comments: Mapping[str, str], prefix: str = "", indent: int = 0
) -> list[str]:
    """`values` (a composed config, as plain dicts) as YAML lines, each key under its comment
    from `comments` (dotted keys, `prefix` in front of this level's)."""
    pad, lines = " " * indent, []
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        lines += [f"{pad}# {line}".rstrip() for line in comments.get(dotted, "").splitlines()]
        if isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}:")
            lines += commented_yaml(value, comments, f"{dotted}.", indent + 2)
        else:
            lines.append(f"{pad}{key}: {yaml_value(value)}")
    return lines
