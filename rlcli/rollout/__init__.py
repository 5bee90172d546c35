"""Sampling responses: the `Rollout` batch (`batch`), the `Sampler` protocol and the
`SAMPLERS` registry (`samplers`), and the samplers themselves: `hf` (transformers' generate
on the learner's weights) and `vllm_engine` (a vLLM engine in the learner's process).

Choosing `sampler=hf` never imports vLLM: a sampler's module is imported when it is picked.
"""
