"""rlcli: reinforcement-learning post-training of language models from the command line."""

import os
from importlib.metadata import PackageNotFoundError, version

# PyTorch's CPU allocator backs tensors of 2 MB or more with transparent huge pages when this is
# set; it reads it once, at torch's first allocation, so it is set here, before torch loads.
# Each fresh large tensor is otherwise faulted in 4 KB at a time, which is slower, and the
# learner makes several each pass (see docs/performance.md, "What the learner does").
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

try:  # the version in pyproject.toml, as installed
    __version__ = version("rlcli")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
