"""Checks of a command line's overrides before Hydra composes them: a group choice that does
not exist, or a key that is not in the config, is named with the valid ones in one paragraph
(Hydra's own messages for them span many lines). A key that is TRL's or verl's name for an
option (`num_generations`, `actor_rollout_ref.rollout.n`) is answered with rlcli's name for it
and the override to write (`PEER_NAMES`), and options in TRL's style (`--learning_rate=1e-6`,
`--num_generations 8`) are read as the overrides they stand for (`read_dashed`). They read only
the schema and conf/'s files, not the registries, so they sit at the bottom beside the schema.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from itertools import takewhile
from pathlib import Path

from rlcli.config.free_form import refuse_deletion
from rlcli.config.moved import MOVED, moved_message
from rlcli.config.peer_names import TRL_NAMES, PeerName
from rlcli.config.schema import CONF_DIR, Config, ConfigError
from rlcli.config.verl_names import VERL_NAMES


def group_choices(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """Each config group of conf/ (algo, reward, ...) and its choices (the YAML file names)."""
    return {
        d.name: sorted(f.stem for f in d.glob("*.yaml"))
        for d in sorted(conf_dir.iterdir())
        if d.is_dir() and any(d.glob("*.yaml"))
    }


# Other tools' names for rlcli's options, answered when one is given as a key. A name holding
# dots is matched whole or by its tail (rollout.n); one without, also under any section
# (trainer.num_generations); one ending in .*, by any key under it (kl_ctrl.type).
PEER_NAMES: dict[str, PeerName] = {**TRL_NAMES, **VERL_NAMES}


def peer_name(key: str) -> str | None:
    """The name in PEER_NAMES that `key` is: itself, else the one that accounts for most of its
    dotted parts (`parts_matched`), else one with its last part (`trainer.clip_ratio_high`);
    None when it is no other tool's name."""
    if key in PEER_NAMES:
        return key
    best = max(PEER_NAMES, key=lambda name: (parts_matched(name, key), len(name)))
    if parts_matched(best, key):
        return best
    # A last part that is the name of an rlcli field (path, lr) is more likely that field put
    # under the wrong section: the usual message lists the section's keys.
    last = key.rsplit(".", 1)[-1]
    if last in field_names():
        return None
    return next((n for n in PEER_NAMES if n.rsplit(".", 1)[-1] == last), None)


def parts_matched(name: str, key: str) -> int:
    """How many of `key`'s dotted parts the other tool's `name` accounts for, 0 for none: all
    of them when `key` is its tail (`rollout.n`), its own when `key` ends with it
    (`trainer.num_generations`), and a `SECTION.*`'s those of the section (or the section's
    tail) `key` starts with (`kl_ctrl.type`)."""
    parts = key.split(".")
    if name.endswith(".*"):
        section = name[:-2]
        heads = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        return max((h.count(".") + 1 for h in heads
                    if section == h or section.endswith(f".{h}")), default=0)  # fmt: skip
    if name.endswith(f".{key}"):
        return len(parts)
    return name.count(".") + 1 if key.endswith(f".{name}") else 0


def field_names(node=None) -> set[str]:
    """The names of every field and section of the config, at any depth."""
    node = Config() if node is None else node
    names = set()
    for f in dataclasses.fields(node):
        names.add(f.name)
        if dataclasses.is_dataclass(value := getattr(node, f.name)):
            names |= field_names(value)
    return names


def peer_override(peer: PeerName, value: str) -> str | None:
    """The override(s) rlcli reads for `value` of the other tool's option, or None."""
    if value.lower() in peer.values:
        return peer.values[value.lower()]
    if not peer.example or not value:
        return None
    listed = value if value.startswith("[") else f"[{value}]"
    return peer.example.format(value=value, list=listed)


def peer_message(key: str, name: str, value: str | None = None) -> str:
    """`key` (the given form of the other tool's `name`) is not rlcli's: what to write."""
    peer = PEER_NAMES[name]
    where = f"in rlcli it is {peer.rlcli}" if peer.rlcli else "rlcli has no such option"
    whose = f"are {peer.tool}'s names" if name.endswith(".*") else f"is {peer.tool}'s name"
    message = f"{name} {whose}; {where}: {peer.means}."
    if peer.rlcli == name:  # the same name in both tools, given without its section
        message = f"the key is {name}, as in {peer.tool}: {peer.means}."
    if key != name:
        message = f"{key} is not a config key: {message}"
    given = (value or "").strip()
    if instead := peer_override(peer, given):
        message += f" Instead of {key}={given}, write {instead}."
    return message


def unknown_key_message(key: str, value: str | None = None) -> str | None:
    """None when `key` (dotted) is a field of the config, or lies under a free-form one (a
    loss's settings); else a message naming the valid keys, or rlcli's name for it when it is
    TRL's or verl's (`value`, the one given, then goes into the override it suggests)."""
    if key in MOVED:  # one of rlcli's own earlier keys
        return moved_message(key, value)
    node, parts, free_form = Config(), key.split("."), False
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the config"
        if free_form:
            return None  # e.g. algo.loss_settings.tau_pos: the piece's signature checks it
        if not dataclasses.is_dataclass(node):
            return f"{key} is not a config key: {where} is a value, not a section."
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            if (name := peer_name(key)) is not None:
                return peer_message(key, name, value)
            valid = sorted(fields)
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f" Did you mean {'.'.join([*parts[:depth], close[0]])}?" if close else ""
            return (
                f"{key} is not a config key: {where} has no {part!r}.{hint} Valid keys of "
                f"{where}: {', '.join(valid)}."
            )
        free_form = str(fields[part].type).startswith("dict")
        node = getattr(node, part)
    return None


def check_overrides(overrides: Sequence[str]) -> None:
    """Raise ConfigError for a group choice that does not exist, a key that is not in the
    config, or the deletion of one of rlcli's keys, before Hydra composes (whose own messages
    span many lines)."""
    groups = group_choices()
    for override in overrides:
        key, sign, value = override.partition("=")
        key = key.lstrip("+")
        if key.startswith("~") and not key.startswith(("~hydra", "~recipe")):
            refuse_deletion(key[1:], unknown_key_message(key[1:]))  # a hole Hydra would leave
        if not sign or key.startswith(("hydra", "~", "-")) or "@" in key or key == "recipe":
            continue
        if key in groups:
            # A sweep (-m) lists choices with commas; other sweep syntax is left to Hydra.
            chosen = [] if "(" in value else value.split(",")
            for name in chosen:
                if name not in groups[key] and name != "null":
                    # TRL's `model` argument is a hub id or a directory.
                    path = key == "model" and "/" in name
                    hint = f" A hub id or directory is model.path: write model.path={name}."
                    raise ConfigError(
                        f"{key}={name} is not one of the valid choices for {key}: "
                        f"{', '.join(groups[key])}.{hint if path else ''}"
                    )
        elif (message := unknown_key_message(key, value)) is not None:
            raise ConfigError(message)


# Hydra's override grammar reads a value's letters and digits unquoted only when they are
# ASCII, and of the other characters only these; `foreign` are all the rest (ä, 路, #, ~, !).
HYDRA_UNQUOTED = frozenset("_-/+.$%*@?|: \t")
# Characters that mean something to the grammar: quotes and escapes, lists, dicts, sweeps,
# functions and interpolations. A value holding one is left as it is written.
HYDRA_GRAMMAR = frozenset("'\"\\[]{}(),=")
GRAMMAR_LINK = "https://hydra.cc/docs/advanced/override_grammar/basic/"


def foreign(text: str) -> list[str]:
    """The characters of `text` that Hydra's grammar reads only inside quotes, in order."""
    plain = HYDRA_UNQUOTED | HYDRA_GRAMMAR
    return [c for c in text if not (c.isascii() and (c.isalnum() or c in plain))]


def quote_for_hydra(override: str) -> str:
    """`override` as Hydra's grammar reads it: a value holding characters it takes only inside
    quotes (a path /tmp/dätä/prøb.jsonl, runs/rün) quoted, so that it is read as written. A
    sweep's choices (a,b) and a list's items ([a,b]) are quoted one by one; a value holding
    quotes, escapes, braces, parentheses or nested lists is left as written (`check_syntax`
    then says to quote it)."""
    key, sign, value = override.partition("=")
    if not sign or not foreign(value) or set(value) & (HYDRA_GRAMMAR - set(",[]")):
        return override
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else None
    if set(value if inner is None else inner) & set("[]"):
        return override
    items = ",".join(_quoted(item) for item in (value if inner is None else inner).split(","))
    return f"{key}={items}" if inner is None else f"{key}=[{items}]"


def _quoted(item: str) -> str:
    """One value, quoted if it holds a foreign character (without the spaces around it, which
    Hydra drops from a value it reads unquoted, and refuses around a quoted one)."""
    return f"'{item.strip()}'" if foreign(item) else item


def check_syntax(overrides: Sequence[str]) -> None:
    """Raise ConfigError for an override Hydra's grammar cannot read (`trainer.lr=[1,`, a
    word without `=`), as `quote_for_hydra` hands it on: Hydra itself reports it with exit code
    1, not a config error's 2."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([quote_for_hydra(override)])
        except OverrideParseException as err:
            # Hydra's message: "Error parsing override ..." (sometimes), the parser's words,
            # then a link; the parser's words are what locate the mistake.
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            words = [line for line in lines if not line.startswith(("Error parsing", "See "))]
            why = f" ({words[0]})" if words else ""
            raise ConfigError(
                f"{override!r} is not a valid override{why}. " + _syntax_fix(override)
            ) from None


def _syntax_fix(override: str) -> str:
    """What to write instead of `override`, which Hydra's grammar cannot read."""
    key, _, value = override.partition("=")
    if chars := list(dict.fromkeys(foreign(value))):
        shown = " ".join(chars[:5])
        return (
            f"Hydra's grammar reads {shown} only inside quotes, which rlcli adds itself only to "
            "a value (or a sweep's or list's items) without quotes, backslashes, braces, "
            f"parentheses or nested lists: quote it yourself, {key}='...' (the whole argument "
            f"in double quotes for the shell, \"{key}='...'\"); see {GRAMMAR_LINK}."
        )
    return (
        "An override is key=value: a list as key=[a,b], a value holding spaces, commas, "
        "brackets, = or quotes quoted as key='a, b' (the whole argument in double quotes for "
        f"the shell); see {GRAMMAR_LINK}."
    )


# Hydra's own options (`--cfg job`, `--multirun`), left for Hydra, as is a prefix of one
# (`--multi`), which Hydra's parser takes for it.
HYDRA_OPTIONS = ("--help", "--hydra-help", "--version", "--cfg", "--resolve", "--package",
                 "--run", "--multirun", "--shell-completion", "--config-path", "--config-name",
                 "--config-dir", "--experimental-rerun", "--info")  # fmt: skip
HYDRA_STYLE = "rlcli's options are key=value: Hydra's style, without dashes"


def read_dashed(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(`argv` with each option in TRL's style read as the overrides it stands for, "OPTION as
    OVERRIDES" for each). TRL's style is argparse's: `--name=value`, `--name value`, `--name a b`
    (a list) and `--name` alone (true, for an on/off option). rlcli's keys and groups are read
    as they are, TRL's and verl's names as the override their answer suggests; Hydra's own
    options are left alone. An option with no single reading is a ConfigError saying why."""
    out, read, i = [], [], 0
    while i < len(argv):
        name, sign, value = argv[i][2:].partition("=")
        if not argv[i].startswith("--") or any(o.startswith(f"--{name}") for o in HYDRA_OPTIONS):
            out.append(argv[i])
            i += 1
            continue
        words = [value] if sign else list(takewhile(is_value, argv[i + 1 :]))
        taken = 1 if sign else 1 + len(words)
        shown, i = " ".join(argv[i : i + taken]), i + taken
        if not words:
            overrides = on_option(name, shown)
        else:
            value = words[0] if len(words) == 1 else f"[{','.join(words)}]"
            if (overrides := dashed_overrides(name, value)) is None:
                reason = unknown_key_message(name, value)
                raise ConfigError(f"{shown} is read as {name}={value} ({HYDRA_STYLE}): {reason}")
        out += overrides
        read.append(f"{shown} as {' '.join(overrides)}")
    return out, read


def is_value(word: str) -> bool:
    """Whether `word`, after `--name`, is its value: not an override, nor an option, but a
    negative number may be one."""
    return "=" not in word and (not word.startswith("-") or word[1:2].isdigit())


def dashed_overrides(name: str, value: str) -> list[str] | None:
    """The overrides `--name value` stands for: `name=value` for rlcli's own key or group, the
    override the answer to TRL's or verl's `name` suggests, or None where there is neither."""
    if name in group_choices() or name in ("recipe", "hydra") or name.startswith("hydra."):
        return [f"{name}={value}"]
    if unknown_key_message(name) is None:
        return [f"{name}={value}"]
    peer = peer_name(name)
    instead = peer_override(PEER_NAMES[peer], value) if peer else None
    return instead.split() if instead else None


def on_option(name: str, shown: str) -> list[str]:
    """The overrides of `--name` alone, an on/off option (TRL's `--use_peft`): `name=true`
    where what it sets is a true-or-false field or the other tool's answer names true."""
    overrides = dashed_overrides(name, "true") or []
    unknown = unknown_key_message(name)
    peer = peer_name(name) if unknown else None
    named = peer is not None and "true" in PEER_NAMES[peer].values
    if overrides and (named or all(is_on_off(o.partition("=")[0]) for o in overrides)):
        return overrides
    why = f"write {name}=VALUE."
    if peer:
        field = PEER_NAMES[peer].rlcli or ""
        why = peer_message(name, peer) + (f" Write {field}=VALUE." if field_type(field) else "")
    elif unknown:
        why = unknown
    raise ConfigError(f"{shown} has no value ({HYDRA_STYLE}): {why}")


def field_type(key: str) -> str | None:
    """The schema's type of the dotted `key` (`bool`, `float | None`), None where it is no
    field or a section."""
    node, *sections, last = [Config(), *key.split(".")]
    for part in sections:
        node = getattr(node, part, None)
    is_section = dataclasses.is_dataclass(node)
    types = {f.name: str(f.type) for f in dataclasses.fields(node)} if is_section else {}
    return None if dataclasses.is_dataclass(getattr(node, last, None)) else types.get(last)


def is_on_off(key: str) -> bool:
    """Whether the dotted `key` is a field of the config that is true or false."""
    return (field_type(key) or "").startswith("bool")


# Hydra's flags that take a value (`--cfg job`); `--info` takes one only from its topics.
VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
               "-cn", "--config-dir", "-cd", "--experimental-rerun")  # fmt: skip
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def split_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the overrides), each in the order given. Hydra's
    argument parser reads the overrides as one run of positional arguments, so a flag between
    or after them (`algo=grpo,dapo -m`) must move in front: then flags work in any position,
    as users of Hydra apps expect."""
    flags, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        takes_value = arg in VALUE_FLAGS or (
            arg == "--info" and i + 1 < len(argv) and argv[i + 1] in INFO_TOPICS
        )
        if arg.startswith("-") and takes_value and i + 1 < len(argv):
            flags += argv[i : i + 2]
            i += 2
            continue
        (flags if arg.startswith("-") else overrides).append(arg)
        i += 1
    return flags, overrides
