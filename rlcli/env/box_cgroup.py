"""The memory cgroup a python tool box runs in, where one can be made: the one limit that counts
what the kernel holds for the box too (files' inodes, page tables), which the rlimits and the
seccomp filter cannot. `sandbox.run_python` makes one per call and removes it after.
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
import time
from pathlib import Path

# Where a memory cgroup can be made, the box runs in one of its code's limit, its two tmpfs and
# this much for what the kernel keeps for it (page tables, files' inodes, sockets' queues):
# the one limit that counts everything, which the rlimits and the filter cannot.
CGROUP_SLACK_MB = 64
# The files that set a cgroup's memory limit and its swap (cgroup v1, v2).
V1 = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
V2 = ("memory.max", "memory.swap.max")
# Run by sh as `sh -c ENTER_CGROUP PROCS COMMAND...`: moves itself into the cgroup, then becomes
# bubblewrap, so that every process of the box starts inside it.
ENTER_CGROUP = 'echo $$ > "$0" && exec "$@"'
# The environment of the `sh` that tries a place (`_can_enter`).
SH_ENV = {"PATH": "/usr/bin:/bin"}


def make_cgroup(limit_mb: int) -> Path | None:
    """A new memory cgroup holding at most `limit_mb` MiB, where this user can make one and
    enter it (`cgroup_places`); None elsewhere."""
    for base, files in cgroup_places():
        try:
            path = Path(tempfile.mkdtemp(prefix="rlcli-box-", dir=base))
        except OSError:
            continue
        try:
            (path / files[0]).write_text(str(limit_mb * 2**20))
            if (path / files[1]).exists():  # no swap either (v1: memory and swap together)
                (path / files[1]).write_text(str(limit_mb * 2**20) if files == V1 else "0")
            return path
        except OSError:
            remove_cgroup(path)
    return None


@functools.cache
def cgroup_places() -> tuple[tuple[Path, tuple[str, str]], ...]:
    """Where a box's memory cgroup can go: under this process's own cgroup, in v1's memory
    hierarchy, or in v2's where the memory controller is open to children (a v2 cgroup with
    processes cannot open it: in practice only root's top). Each kept once a cgroup made there
    could be entered."""
    places = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, own = line.split(":", 2)
        if "memory" in controllers.split(","):
            places.append((Path("/sys/fs/cgroup/memory" + own), V1))
        elif not controllers:
            for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                control = Path(mount + own) / "cgroup.subtree_control"
                if control.is_file() and "memory" in control.read_text().split():
                    places.append((control.parent, V2))
    return tuple(place for place in places if _can_enter(place))


def _can_enter(place: tuple[Path, tuple[str, str]]) -> bool:
    path = None
    try:
        path = Path(tempfile.mkdtemp(prefix="rlcli-box-", dir=place[0]))
        enter = ["sh", "-c", ENTER_CGROUP, str(path / "cgroup.procs"), "true"]
        return subprocess.run(enter, capture_output=True, env=SH_ENV).returncode == 0
    except OSError:
        return False
    finally:
        if path is not None:
            remove_cgroup(path)


def remove_cgroup(path: Path) -> None:
    """Removed once the box's last process has gone (it dies with bubblewrap, a moment
    later); left behind empty after 2 s."""
    for _ in range(100):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
