"""Mean reward at the start and end of a fixed-length tiny-model run, for every algo config.

Runs each `conf/algo/*.yaml` under exactly the settings of tests/train/test_algos.py (tiny random
model, `reward=space_rate`) and prints a Markdown table:

    PYTHONPATH=. .venv/bin/python scripts/algo_table.py [--steps 25] [extra overrides...]
"""

import argparse
import time

from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose
from tests.conftest import TINY_ANY_ALGO
from tests.train.test_algos import ALGOS, EXTRA, STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = parser.parse_args()
    print("| algo | steps | reward, mean of the first 5 steps | reward, mean of the last 5 | s |")
    print("|---|---|---|---|---|")
    for algo in ALGOS:
        start = time.perf_counter()
        run = setup(
            compose([f"algo={algo}", *TINY_ANY_ALGO, *EXTRA.get(algo, []), *args.overrides])
        )
        steps = STEPS.get(algo, args.steps)
        rewards = [train_step(run)["reward/mean"] for _ in range(steps)]
        first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
        seconds = time.perf_counter() - start
        print(f"| {algo} | {steps} | {first:.3f} | {last:.3f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
