"""A step-time model for rollout workers and a learner: what one RL step costs, synchronous or
streamed (sampler.max_staleness), from the phases measured apart.

    generate  seconds the workers take to generate one step's batch, nothing else running
    learn     seconds the learner takes for one step's work apart from sampling: log-probs,
              rewards, advantages, the update
    push      seconds of one weight push
    paused    seconds of it the workers are paused: all of it with NCCL, which loads each
              tensor as it arrives; with gloo (CPU) only the load, as they receive generating

Synchronous (max_staleness=0) the three follow one another: generate + learn + push.
Streamed (max_staleness >= 1) the workers generate the next steps' batches while the learner
trains; in steady state each side repeats its own cycle and the slower one sets the pace:
max(generate + paused, learn + push), since the learner sends the whole push and the workers
stop for the pause; with NCCL, max(generate, learn) + push.
A larger max_staleness does not lower that bound; it absorbs the variation of generation
times (long responses, stragglers), which this model leaves out.

`cluster_step` applies it to GPUs: a node's GPUs split between workers and learner ranks,
each side's time its tokens over its aggregate rate. docs/scaling.md checks the model
against the CPU measurements of scripts/bench_stream.py and tabulates it for one 8-GPU node.
"""

from __future__ import annotations

from dataclasses import dataclass


def step_seconds(
    generate: float, learn: float, push: float, max_staleness: int, paused: float | None = None
) -> float:
    """Seconds per step in steady state (see the module's docstring); `paused` None: the
    whole push."""
    if max_staleness == 0:
        return generate + learn + push
    paused = push if paused is None else paused
    return max(generate + paused, learn + push)


@dataclass(frozen=True)
class Cluster:
    gpus: int  # on the node, split between workers and learner ranks
    generate_tokens_per_s: float  # one worker GPU's decode throughput at the batch's size
    learn_tokens_per_s: float  # one learner GPU's tokens (prompt + response) through a step
    push_s: float  # one weight push


def cluster_step(
    cluster: Cluster, worker_gpus: int, generated: float, learned: float, max_staleness: int
) -> tuple[float, float, float]:
    """(generate, learn, step) seconds of a step that generates `generated` response tokens and
    trains on `learned` tokens (prompts and responses), with `worker_gpus` of the node's GPUs
    generating and the others learning; `worker_gpus` = 0: colocated, every GPU generating and
    then learning (verl's hybrid engine, rlcli's default sampler), synchronous."""
    if worker_gpus == 0:
        generate = generated / (cluster.generate_tokens_per_s * cluster.gpus)
        learn = learned / (cluster.learn_tokens_per_s * cluster.gpus)
        return generate, learn, step_seconds(generate, learn, cluster.push_s, 0)
    generate = generated / (cluster.generate_tokens_per_s * worker_gpus)
    learn = learned / (cluster.learn_tokens_per_s * (cluster.gpus - worker_gpus))
    return generate, learn, step_seconds(generate, learn, cluster.push_s, max_staleness)


def table(cluster: Cluster, generated: float, learned: float, staleness: int) -> list[str]:
    """Markdown rows: each split of the node's GPUs, synchronous and streamed."""
    rows = ["| shape | generate s | learn s | step s, synchronous | step s, max_staleness="
            f"{staleness} |", "|---|---|---|---|---|"]  # fmt: skip
    for workers in range(cluster.gpus):
        shape = (
            f"colocated on {cluster.gpus}"
            if workers == 0
            else f"{workers} worker GPUs, {cluster.gpus - workers} learner"
        )
        generate, learn, sync = cluster_step(cluster, workers, generated, learned, 0)
        streamed = (
            "-"
            if workers == 0
            else f"{step_seconds(generate, learn, cluster.push_s, staleness):.1f}"
        )
        rows.append(f"| {shape} | {generate:.1f} | {learn:.1f} | {sync:.1f} | {streamed} |")
    return rows


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="The step-time model's table for one node.")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--generate-tokens-per-s", type=float, required=True)
    parser.add_argument("--learn-tokens-per-s", type=float, required=True)
    parser.add_argument("--push-s", type=float, required=True)
    parser.add_argument("--generated", type=float, required=True, help="response tokens a step")
    parser.add_argument("--learned", type=float, required=True, help="all tokens a step trains")
    parser.add_argument("--staleness", type=int, default=2)
    args = parser.parse_args()
    cluster = Cluster(args.gpus, args.generate_tokens_per_s, args.learn_tokens_per_s, args.push_s)
    print("\n".join(table(cluster, args.generated, args.learned, args.staleness)))


if __name__ == "__main__":
    main()
