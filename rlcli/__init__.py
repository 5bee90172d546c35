"""rlcli: reinforcement-learning post-training of language models from the command line."""

__version__ = "0.1.0"
