"""Multi-turn sampling with tools (`env=...`): `EpisodeSampler` wraps the vLLM sampler (the
engine in this process, or the rollout workers of `sampler.workers`/`sampler.urls`) or the
transformers one, and runs `env.episode.run_episodes` on it, every episode of the batch
advancing together (one `turns` call per turn, which the workers split among themselves; an
episode that has finished waits for the others).

A tool's output enters the context as a tool turn written by the tokenizer's own chat
template (for SmolLM2: the model's turn closed, then `<|im_start|>tool ... <|im_end|>` and a
new assistant turn; for Qwen2.5: `<tool_response>` inside a user turn); a tokenizer without a
template gets `<result>...</result>` (env.tool_format=rlcli only); the output itself is plain
text there, a special token's string in it read as its characters. Contexts are passed to the
engine as token ids, never re-tokenized text, so the learner trains on exactly the tokens
that were sampled. With env.tool_format=chat_template the prompts also declare the tools
through the template (`data.problems.prompt_renderer` renders them with `env.prompt_tools`)
and calls are read in the template's format (`env.chat_template`).
"""

from __future__ import annotations

from rlcli.config import EnvConfig, SamplerConfig
from rlcli.env import call_format
from rlcli.env.episode import run_episodes
from rlcli.env.tools import Toolbox
from rlcli.rollout.batch import Rollout, encode_prompts, rollout_from_tokens
from rlcli.rollout.contract import Sampler

_ASSISTANT, _TOOL = "\x00assistant\x00", "\x00tool\x00"


def tool_turn_text(tokenizer) -> tuple[str, str]:
    """(text before, text after) a tool's output: from the end of the model's turn to the
    start of its next one, as the chat template writes a `tool` message."""
    messages = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": _ASSISTANT},
        {"role": "tool", "content": _TOOL},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        before, after = text.split(_ASSISTANT, 1)[1].split(_TOOL, 1)
        return before, after
    except Exception:  # no template, or one without a tool role
        return "\n<result>\n", "\n</result>\n"


class EpisodeSampler(Sampler):
    """A sampler whose responses are whole episodes: the model's turns and the tool turns
    between them, the latter masked out of `response_mask`."""

    def __init__(
        self,
        base: Sampler,
        tokenizer,
        env: EnvConfig,
        cfg: SamplerConfig,
        own_logprobs: bool = False,
    ):
        self.base, self.tokenizer, self.env, self.cfg = base, tokenizer, env, cfg
        self.own_logprobs = own_logprobs  # the base's backend returns log-probs of its own
        self.calls = call_format(env, tokenizer)
        self.toolbox = Toolbox(env, self.calls)
        self.before, self.after = tool_turn_text(tokenizer)

    def sync(self, policy) -> None:
        self.base.sync(policy)

    @property
    def device(self):
        return self.base.device

    @property
    def version(self) -> int:
        """The version of the weights the base sampler holds (rollout workers only)."""
        return self.base.version

    def state_dict(self) -> dict:
        return self.base.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.base.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        return self.base.metrics()  # the episodes' env/* come with the batch (collect.collector)

    def close(self) -> None:
        """Stop the rollout workers the base sampler started, if any."""
        self.base.close()

    def _tool_tokens(self, output: str) -> list[int]:
        """A tool turn's tokens: the template's wrapper, with its special tokens, around the
        output read as plain text. A special token's string in the output (`<|im_end|>`,
        `<|im_start|>user`) becomes the tokens of its characters: otherwise a tool, or code
        the model wrote, could close the tool turn and forge a user's or the model's turn."""

        def ids(text: str, **options) -> list[int]:
            return self.tokenizer(text, add_special_tokens=False, **options).input_ids

        return ids(self.before) + ids(output, split_special_tokens=True) + ids(self.after)

    def sample(
        self,
        prompts: list[str],
        group_size: int,
        prompt_ids: list[str],
        answers: list[str],
        temperature: float | None = None,
        seed: int | None = None,
        top_p: float | None = None,
    ) -> Rollout:
        """`group_size` episodes per prompt, as a Rollout whose texts are the model's words and
        whose `episodes` are their transcripts."""
        budget = ("env.max_tokens", self.env.max_tokens)
        encoded = encode_prompts(self.tokenizer, prompts, self.cfg, budget)
        starts = [ids for ids in encoded for _ in range(group_size)]

        def generate(contexts, budgets):
            return self.base.turns(contexts, budgets, [self.calls.stop], temperature, top_p)

        with self.base.seeded(seed):
            episodes = run_episodes(
                starts,
                generate,
                self.toolbox,
                self._tool_tokens,
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                self.env.max_turns,
                self.env.max_tokens,
                self.cfg.max_new_tokens,
            )
        versions = [e.versions for e in episodes]
        return rollout_from_tokens(
            starts,
            [e.tokens for e in episodes],
            texts=[e.text for e in episodes],
            prompt_ids=[p for p in prompt_ids for _ in range(group_size)],
            pad_id=self.tokenizer.pad_token_id,
            device=self.base.device,
            answers=[a for a in answers for _ in range(group_size)],
            truncated=[e.truncated for e in episodes],
            sampler_logp=[e.logprobs for e in episodes] if self.own_logprobs else None,
            own_masks=[e.mask for e in episodes],
            tool_calls=[e.calls for e in episodes],
            episodes=[e.transcript() for e in episodes],
            versions=None if None in versions else versions,
        )
