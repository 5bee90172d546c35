"""Reward functions for conversational data, written as for TRL's GRPOTrainer: each completion
is a list of messages (the reply is `completion[0]["content"]`), each prompt the conversation
before it. Used by the conversational example of docs/data-and-reward.md, whose records have
no answer column (data.answer_field=null)."""

import re

LAST_LINE_NUMBER = re.compile(r"\n\s*-?\d+(?:\.\d+)?\s*$")


def ends_with_a_number(completions, **kwargs):
    """1.0 when the reply's last line is a number alone, as the system message asks."""
    return [float(bool(LAST_LINE_NUMBER.search(c[0]["content"]))) for c in completions]


def follows_up(prompts, completions, trainer_state, **kwargs):
    """Longer replies to conversations with an earlier exchange, weighted up as training goes
    (trainer_state.global_step of max_steps): a reward that reads the whole prompt."""
    progress = trainer_state.global_step / max(trainer_state.max_steps, 1)
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        earlier_turns = sum(m["role"] == "assistant" for m in prompt)
        scores.append(progress * earlier_turns * min(len(completion[0]["content"]) / 200, 1.0))
    return scores
