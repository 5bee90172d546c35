"""Sampling responses: the `Rollout` batch (`batch`), the sampler contract (`contract`), the
backends `sampler.name` picks from, one module each (`backends/`), and the samplers
themselves: `hf` (transformers' generate on the learner's weights), `vllm_engine` (a vLLM
engine in the learner's process) and `workers` (vLLM servers in processes of their own).

Choosing `sampler=hf` never imports vLLM: a backend imports its sampler's module in `make`.
"""
