"""Checks of a command line's overrides before Hydra composes them: a group choice that does
not exist, or a key that is not in the config, is named with the valid ones in one paragraph
(Hydra's own messages for them span many lines). They read only the schema and conf/'s files,
not the registries, so they sit at the bottom beside the schema.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from pathlib import Path

from rlcli.config.schema import CONF_DIR, Config, ConfigError


def group_choices(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """Each config group of conf/ (algo, reward, ...) and its choices (the YAML file names)."""
    return {
        d.name: sorted(f.stem for f in d.glob("*.yaml"))
        for d in sorted(conf_dir.iterdir())
        if d.is_dir() and any(d.glob("*.yaml"))
    }


def unknown_key_message(key: str) -> str | None:
    """None when `key` (dotted) is a field of the config; else a message naming the valid keys."""
    node, parts = Config(), key.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the config"
        if not dataclasses.is_dataclass(node):
            return f"{key} is not a config key: {where} is a value, not a section."
        valid = sorted(f.name for f in dataclasses.fields(node))
        if part not in valid:
            close = difflib.get_close_matches(part, valid, n=1)
            hint = f" Did you mean {'.'.join([*parts[:depth], close[0]])}?" if close else ""
            return (
                f"{key} is not a config key: {where} has no {part!r}.{hint} Valid keys of "
                f"{where}: {', '.join(valid)}."
            )
        node = getattr(node, part)
    return None


def check_overrides(overrides: Sequence[str]) -> None:
    """Raise ConfigError for a group choice that does not exist or a key that is not in the
    config, before Hydra composes (whose own messages span many lines)."""
    groups = group_choices()
    for override in overrides:
        key, sign, value = override.partition("=")
        key = key.lstrip("+")
        if not sign or key.startswith(("hydra", "~", "-")) or "@" in key or key == "recipe":
            continue
        if key in groups:
            # A sweep (-m) lists choices with commas; other sweep syntax is left to Hydra.
            chosen = [] if "(" in value else value.split(",")
            for name in chosen:
                if name not in groups[key] and name != "null":
                    raise ConfigError(
                        f"{key}={name} is not one of the valid choices for {key}: "
                        f"{', '.join(groups[key])}."
                    )
        elif (message := unknown_key_message(key)) is not None:
            raise ConfigError(message)


def check_syntax(overrides: Sequence[str]) -> None:
    """Raise ConfigError for an override Hydra's grammar cannot read (`trainer.lr=[1,`, a
    word without `=`): Hydra itself reports it with exit code 1, not a config error's 2."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as err:
            # Hydra's message: "Error parsing override ..." (sometimes), the parser's words,
            # then a link; the parser's words are what locate the mistake.
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            words = [line for line in lines if not line.startswith(("Error parsing", "See "))]
            why = f" ({words[0]})" if words else ""
            raise ConfigError(
                f"{override!r} is not a valid override{why}. An override is key=value: a "
                "list as key=[a,b], a value holding spaces, commas, brackets, = or quotes "
                "quoted as key='a, b' (the whole argument in double quotes for the shell); "
                "see https://hydra.cc/docs/advanced/override_grammar/basic/."
            ) from None
