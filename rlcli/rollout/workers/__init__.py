"""Rollout workers: vLLM servers in processes of their own, by role. Their processes and the
`vllm serve` command (`processes`), HTTP to them with `WorkerLost` (`client`), the weight push
through vLLM's weight-transfer API (`weight_push`) and rlcli's gloo backend of it for CPU
(`gloo_transfer`), and the `WorkerSampler` made of them (`sampler`).
"""
