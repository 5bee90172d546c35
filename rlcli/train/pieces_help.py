"""The losses and advantage estimators as `rlcli train --help` lists them, each with its
settings and needs, read from the registries (`describe_pieces`). `rlcli.config.help` lays
the text out; it reads only conf/, so the caller hands it this.
"""

from __future__ import annotations

from rlcli.ops.advantages import ADVANTAGES
from rlcli.ops.losses import LOSSES


def describe_pieces() -> str:
    """The losses and estimators with their settings and needs, for `rlcli train --help`."""
    lines = []
    for title, registry in (("algo.loss", LOSSES), ("algo.advantage", ADVANTAGES)):
        lines.append(f"{title} (or your own: 'path/to/file.py:function'):")
        for name, p in sorted(registry.items()):
            extra = ", ".join(f"{k}={v!r}" for k, v in p.settings.items())
            tail = (f"  [settings: {extra}]" if extra else "") + (
                f"  [needs: {', '.join(sorted(p.needs))}]" if p.needs else ""
            )
            lines.append(f"  {name:22} {p.doc}{tail}")
    return "\n".join(lines)
