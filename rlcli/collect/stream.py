"""Rollouts streamed ahead of the learner (`sampler.max_staleness=k` >= 1; docs/scaling.md,
"Streaming rollouts").

A round is what one generation round of a step samples: a group for each of the step's
problems (and ReMax's greedy replies beside them). `RoundsAhead` keeps up to k rounds sampling
on the rollout workers while the learner trains, so no token a step trains on is more than k
updates old. Rounds are drawn from the prompt stream in order, so a run samples the same
problems in the same steps whatever k is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from rlcli.data.problems import Problem


@dataclass
class Round:
    problems: list[Problem]
    position: int  # the prompt stream's position before its problems were drawn
    sampled: Future  # -> what `sample` returned for them


class RoundsAhead:
    """Up to `ahead` rounds sampling in the background, oldest first.

    A step takes the oldest (waiting for it if it is not done, or asking for one now if none is
    under way), and then tops the queue up to `ahead` = k again. So the round a step takes was
    asked for k steps earlier, when the learner held the weights of k updates before this step's:
    no token of it is more than k updates old (the workers take each push in flight,
    `rollout.workers.sampler`), and with several rounds a step (DAPO's dynamic sampling) it is
    fresher.

    `draw()` gives the next round's problems and `position()` the prompt stream's position
    before it; `sample(problems)` samples them (on another thread: it must only talk to the
    workers, not touch what the learner's thread uses)."""

    def __init__(
        self,
        ahead: int,
        draw: Callable[[], list[Problem]],
        position: Callable[[], int],
        sample: Callable[[list[Problem]], object],
    ):
        self.ahead, self.draw, self.position, self.sample = ahead, draw, position, sample
        self.queue: deque[Round] = deque()
        self.pool = ThreadPoolExecutor(max_workers=ahead + 1, thread_name_prefix="rounds-ahead")

    def _submit(self) -> None:
        position = self.position()
        problems = self.draw()
        self.queue.append(Round(problems, position, self.pool.submit(self.sample, problems)))

    def take(self) -> tuple[list[Problem], object]:
        """The oldest round's problems and what sampling them gave, once it is done. A round
        that failed stays first in the queue (so a checkpoint samples it again) and raises."""
        if not self.queue:
            self._submit()
        head = self.queue[0]
        sampled = head.sampled.result()  # its WorkerLost, if any, is raised here
        self.queue.popleft()
        return head.problems, sampled

    def top_up(self, limit: int) -> None:
        """Ask for rounds until `ahead` are under way, or `limit` (the steps still to come)."""
        while len(self.queue) < min(self.ahead, limit):
            self._submit()

    def oldest_position(self) -> int | None:
        """The prompt stream's position before the oldest round not taken; None if none. A
        checkpoint records it: a resumed run samples those problems again, with the saved
        weights, and the rounds under way are discarded (`Collector.resume_position`)."""
        return self.queue[0].position if self.queue else None

    def close(self) -> None:
        """Drop the rounds not started; those under way end with the workers' requests."""
        for r in self.queue:
            r.sampled.cancel()
        self.queue.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)
