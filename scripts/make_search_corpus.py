"""Write the small search corpus and its questions that recipe=cpu/dupo_websailor_search uses.

  .venv/bin/python scripts/make_search_corpus.py   (rewrites recipes/data/search_*.jsonl)

Fictional towns with made-up numbers (founding year, inhabitants, height of a landmark), so a
model cannot know the answers: it has to search. One document per town; three questions per
town, each answered by a number in exactly one document. Seeded, so the files are the same
every time.
"""

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "recipes" / "data"
SYLLABLES = ["vel", "mor", "ka", "tan", "ri", "sol", "bra", "nen", "dor", "li", "ost", "va",
             "quel", "mir", "zan", "tor", "ela", "gro", "pen", "ush"]  # fmt: skip
LANDMARKS = ["lighthouse", "bell tower", "stone bridge", "windmill", "clock tower"]
REGIONS = ["northern coast", "eastern hills", "river delta", "western plains", "southern lakes"]


def main(towns: int = 60, seed: int = 7) -> None:
    rng = random.Random(seed)
    names: set[str] = set()
    while len(names) < towns:
        names.add("".join(rng.sample(SYLLABLES, rng.choice([2, 3]))).capitalize())
    docs, questions = [], []
    for name in sorted(names):
        year, people = rng.randint(1100, 1950), rng.randint(800, 98000)
        landmark, height = rng.choice(LANDMARKS), rng.randint(12, 140)
        text = (
            f"{name} is a town in the {rng.choice(REGIONS)}. It was founded in {year} and has "
            f"{people} inhabitants. Its {landmark} is {height} metres tall."
        )
        docs.append({"title": name, "text": text})
        asked = [
            (f"In what year was the town of {name} founded?", year),
            (f"How many inhabitants does {name} have?", people),
            (f"How tall, in metres, is the {landmark} of {name}?", height),
        ]
        questions += [{"question": q, "answer": str(a)} for q, a in asked]
    rng.shuffle(questions)
    for path, rows in (("search_corpus.jsonl", docs), ("search_questions.jsonl", questions)):
        (OUT / path).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} lines to {OUT / path}")


if __name__ == "__main__":
    main()
