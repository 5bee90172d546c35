"""Streamed rollouts (sampler.max_staleness): the rounds sampled ahead, how old a batch's
tokens are, and the weight versions the workers' answers carry. The real workers taking a
push mid-generation are tested in tests/rollout/test_workers.py; here, the bookkeeping around
them."""

import threading

import pytest
import torch

from rlcli.collect.collector import staleness_metrics
from rlcli.collect.stream import RoundsAhead
from rlcli.data.problems import Problem, PromptStream
from rlcli.rollout.batch import rollout_from_tokens
from rlcli.rollout.workers.client import read_answer, token_versions

PROBLEMS = [Problem(f"p{i}", f"question {i}", str(i)) for i in range(10)]


def rounds(ahead: int, sample):
    stream = PromptStream(PROBLEMS, seed=0)
    return stream, RoundsAhead(ahead, lambda: stream.take(2), lambda: stream.position, sample)


def ids(problems) -> list[str]:
    return [p.id for p in problems]


def test_rounds_are_taken_in_the_order_drawn_and_topped_up_to_ahead():
    sampled = []
    stream, ahead = rounds(2, lambda problems: sampled.append(ids(problems)) or ids(problems))
    order = ids(PromptStream(PROBLEMS, seed=0).take(10))  # what a synchronous run draws
    problems, result = ahead.take()  # none under way: asked for now
    assert ids(problems) == result == order[0:2]
    ahead.top_up(limit=100)
    assert len(ahead.queue) == 2 and ahead.oldest_position() == 2 and stream.position == 6
    assert ahead.take()[1] == order[2:4]
    assert ahead.take()[1] == order[4:6]
    assert ahead.oldest_position() is None
    # Near the end of the run no round is asked for that no step would take.
    ahead.top_up(limit=1)
    assert len(ahead.queue) == 1
    ahead.top_up(limit=0)
    assert len(ahead.queue) == 1
    assert ahead.take()[1] == order[6:8]
    assert [s for s in sampled] == [order[i : i + 2] for i in range(0, 8, 2)]
    ahead.close()


def test_a_round_that_failed_stays_first_so_a_checkpoint_samples_it_again():
    calls = []

    def sample(problems):
        calls.append(ids(problems))
        if len(calls) == 2:
            raise ConnectionError("worker gone")
        return ids(problems)

    stream, ahead = rounds(2, sample)
    ahead.take()
    ahead.top_up(limit=100)  # rounds 2 (fails) and 3
    with pytest.raises(ConnectionError):
        ahead.take()
    assert ahead.oldest_position() == 2  # the failed round's problems are not skipped
    ahead.close()


def test_the_learner_waits_for_a_round_still_sampling():
    release = threading.Event()
    stream, ahead = rounds(1, lambda problems: release.wait(10) and ids(problems))
    ahead.top_up(limit=5)
    taken = []
    thread = threading.Thread(target=lambda: taken.append(ahead.take()))
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and not taken  # waiting on the workers
    release.set()
    thread.join(10)
    assert taken[0][1] == ids(taken[0][0])
    ahead.close()


def batch_with_versions(versions, mask_rows):
    responses = [[5] * len(v) for v in versions]
    rollout = rollout_from_tokens(
        [[1, 2]] * len(versions), responses, texts=[""] * len(versions),
        prompt_ids=["a"] * len(versions), pad_id=0, device="cpu", versions=versions,
    )  # fmt: skip
    mask = torch.tensor(mask_rows, dtype=rollout.response_mask.dtype)
    rollout.response_mask = rollout.response_mask * mask
    return rollout


def test_staleness_is_counted_over_the_trained_tokens():
    # The learner holds version 3. Response 0: tokens of versions 1, 1, 2 (new weights came
    # mid-response), its last token out of the loss; response 1: 3, 3 and padding.
    batch = batch_with_versions([[1, 1, 2], [3, 3]], [[1, 1, 0], [1, 1, 1]])
    m = staleness_metrics(batch, version=3, max_staleness=2)
    # Trained tokens' staleness: 2, 2 (response 0) and 0, 0 (response 1).
    assert m["rollout/staleness_mean"] == 1.0 and m["rollout/staleness_max"] == 2.0
    assert (m["rollout/staleness_0"], m["rollout/staleness_1"], m["rollout/staleness_2"]) == (
        0.5,
        0.0,
        0.5,
    )
    # Response 0 spans versions 1 and 2, response 1 only 3.
    assert m["rollout/versions_per_response"] == 1.5


def test_a_workers_weight_versions_become_one_per_token():
    spans = [{"version": "4", "start": 0, "end": 2}, {"version": "5", "start": 2, "end": 5}]
    assert token_versions(spans, 5) == [4, 4, 5, 5, 5]
    assert token_versions([{"version": "default", "start": 0, "end": 5}], 5) is None
    assert token_versions(None, 5) is None
    assert token_versions(spans[:1], 5) is None  # tokens no span covers: not labelled
    choice = {
        "token_ids": [7, 8],
        "finish_reason": "stop",
        "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.0}]},
        "weight_versions": [
            {"version": "0", "start": 0, "end": 1},
            {"version": "1", "start": 1, "end": 2},
        ],
    }
    [(tokens, cut, logps, versions)] = read_answer({"choices": [choice]}, 1, 100, 16)
    assert (tokens, cut, logps, versions) == ([7, 8], False, [-0.5, -1.0], [0, 1])


def test_the_busy_clock_counts_requests_in_flight_but_not_a_pushs_pause():
    import time

    from rlcli.rollout.workers.client import BusyClock

    clock = BusyClock(1)
    time.sleep(0.2)  # idle
    with clock.request(0):
        time.sleep(0.3)  # generating
    assert 0.3 < clock.share() < 0.8  # about 0.6; sleeps only ever overshoot
    with clock.request(0):
        clock.pause()  # a push: requests kept, nothing generated
        time.sleep(0.4)
        clock.resume()
    assert clock.share() < 0.2
    assert 0.4 <= clock.paused_seconds() < 0.8  # the pause, counted apart
    assert clock.paused_seconds() == 0.0  # since the last call: none
