"""rlcli: reinforcement-learning post-training of language models from the command line."""

from importlib.metadata import PackageNotFoundError, version

try:  # the version in pyproject.toml, as installed
    __version__ = version("rlcli")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
