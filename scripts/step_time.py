"""A step-time model for rollout workers and a learner: what one RL step costs, synchronous or
streamed (sampler.max_staleness), from the phases measured apart.

    generate  seconds the workers take to generate one step's batch, nothing else running
    learn     seconds the learner takes for one step's work apart from sampling: log-probs,
              rewards, advantages, the update
    push      seconds of one weight push (the workers pause for it)

Synchronous (max_staleness=0) the three follow one another: generate + learn + push.
Streamed (max_staleness >= 1) the workers generate the next steps' batches while the learner
trains; in steady state each side repeats its own cycle and the slower one sets the pace:
max(generate, learn) + push, since a push stops both (the learner sends, the workers pause).
A larger max_staleness does not lower that bound; it absorbs the variation of generation
times (long responses, stragglers), which this model leaves out.

`cluster_step` applies it to GPUs: a node's GPUs split between workers and learner ranks,
each side's time its tokens over its aggregate rate. docs/scaling.md checks the model
against the CPU measurements of scripts/bench_stream.py and tabulates it for one 8-GPU node.
"""

from __future__ import annotations

from dataclasses import dataclass


def step_seconds(generate: float, learn: float, push: float, max_staleness: int) -> float:
    """Seconds per step in steady state (see the module's docstring)."""
    if max_staleness == 0:
        return generate + learn + push
    return max(generate, learn) + push


@dataclass(frozen=True)
class Cluster:
    gpus: int  # on the node, split between workers and learner ranks
    generate_tokens_per_s: float  # one worker GPU's decode throughput at the batch's size
    learn_tokens_per_s: float  # one learner GPU's tokens through all of a step's passes
    push_s: float  # one weight push


def cluster_step(
    cluster: Cluster, worker_gpus: int, tokens: float, max_staleness: int
) -> tuple[float, float, float]:
    """(generate, learn, step) seconds of a step that samples and trains `tokens` response
    tokens with `worker_gpus` of the node's GPUs generating and the others learning."""
    generate = tokens / (cluster.generate_tokens_per_s * worker_gpus)
    learn = tokens / (cluster.learn_tokens_per_s * (cluster.gpus - worker_gpus))
    return generate, learn, step_seconds(generate, learn, cluster.push_s, max_staleness)
