"""The command line's rule for the config's free-form fields, the dicts of a piece's own
settings (`algo.loss_settings`, `algo.advantage_settings`, `trainer.lr_scheduler_kwargs`) and
the policy's from_pretrained arguments (`model.init_kwargs`), whose keys the piece's signature
(or from_pretrained) checks rather than the schema: `FIELD.NAME=VALUE` sets NAME with or
without Hydra's `+` (`settable`), and `~FIELD.NAME` drops a preset setting, where deleting any
other key is refused (`refuse_deletion`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rlcli.config.schema import Config, ConfigError


def free_form_field(key: str) -> str | None:
    """The free-form field (`algo.loss_settings`) that the dotted `key` lies inside, or None
    (the field itself, a schema field, or no key of the config)."""
    node, parts = Config(), key.split(".")
    for depth, part in enumerate(parts[:-1]):
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            return None
        if str(fields[part].type).startswith("dict"):
            return ".".join(parts[: depth + 1])
        node = getattr(node, part)
        if not dataclasses.is_dataclass(node):
            return None
    return None


def settable(overrides: Sequence[str]) -> list[str]:
    """`overrides` with each setting inside a free-form field, given as `key=value` or
    `+key=value`, written as Hydra's `++key=value` (set it, or add it where it is missing), so
    that it sets the key whether or not the composed config already holds it (an algo's YAML
    presets sapo's tau_pos; no YAML presets min_lr_rate). Hydra itself wants `+` for a new key
    and refuses it for an existing one, which a user cannot tell apart."""
    out = []
    for override in overrides:
        key, sign, value = override.partition("=")
        if sign and not key.startswith(("++", "~", "-")) and free_form_field(key.lstrip("+")):
            override = f"++{key.lstrip('+')}={value}"
        out.append(override)
    return out


def refuse_deletion(key: str, unknown: str | None) -> None:
    """Raise ConfigError for `~key` unless `key` lies inside a free-form field; `unknown` is
    the message for a key the config does not have (None when it has it). Deleting a preset
    setting leaves the signature's default to apply; every other key of rlcli's always has a
    value, from conf/, and Hydra would compose a config with a hole in it, on which the run
    would stop with a traceback."""
    if unknown is not None:
        raise ConfigError(unknown)
    if free_form_field(key):
        return
    raise ConfigError(
        f"~{key} would delete {key}, which every run needs: rlcli's keys have no value but "
        f"conf/'s. Leave the override out to keep the default, or set another value with "
        f"{key}=VALUE. Only a setting inside algo.loss_settings, algo.advantage_settings, "
        "trainer.lr_scheduler_kwargs or model.init_kwargs can be deleted "
        "(~algo.loss_settings.NAME)."
    )
