"""Bad inputs and faults tried on the real `rlcli train`: the table of docs/reliability.md.

    .venv/bin/python scripts/bad_input.py              # every case: the table, then the tally
    .venv/bin/python scripts/bad_input.py --only NAME  # one case (a substring of its name)

A bad input passes when rlcli exits with code 2, prints no traceback, and its last line is
`rlcli: error: ...` holding the expected words. A fault passes when no run is left silently
wrong: its function returns None, or what went wrong. Cases run in this process through
`rlcli.cli.main`, as the console script does (a second or two each once torch is imported);
a case that needs a fresh environment, or a second run beside the first, starts one.
A run of every case also writes the table and the tally into docs/reliability.md, between
the page's two marker lines (`TABLE_BEGIN`, `TABLE_END`). tests/cli/test_bad_input.py runs every
case.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no case may reach the network

import torch  # noqa: E402

from rlcli.cli import main  # noqa: E402

TINY = ["model=tiny", "sampler=hf", "reward=space_rate", "logger.progress=false",
        "sampler.max_new_tokens=8", "trainer.max_steps=1"]  # fmt: skip


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    traceback: str | None  # an exception that escaped rlcli: what a user would see

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


def rlcli(run_dir: Path, *overrides: str) -> Result:
    """`rlcli train TINY overrides hydra.run.dir=run_dir` in this process."""
    out, err, code, escaped = io.StringIO(), io.StringIO(), 0, None
    argv = ["train", *TINY, *overrides, f"hydra.run.dir={run_dir}"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        except BaseException:  # noqa: BLE001 - an escaped exception is what we look for
            code, escaped = 1, traceback.format_exc()
    return Result(code, out.getvalue(), err.getvalue(), escaped)


def rlcli_process(run_dir: Path, *overrides: str, env: dict | None = None) -> Result:
    """The same, in a new process (`python -m rlcli`)."""
    command = [sys.executable, "-m", "rlcli", "train", *TINY, *overrides,
               f"hydra.run.dir={run_dir}"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    text = done.stdout + done.stderr
    return Result(done.returncode, done.stdout, done.stderr, text if "Traceback" in text else None)


@dataclass(frozen=True)
class BadInput:
    name: str
    overrides: list[str]  # "{tmp}" is the case's own directory
    expect: str  # words the error line must hold ("{tmp}" too)
    # Made under {tmp} first: a file's text or bytes, or None for an empty directory
    files: dict[str, str | bytes | None] = field(default_factory=dict)
    env: Callable[[Path], dict] | None = None  # a fresh process with this environment


def no_bwrap_env(tmp: Path) -> dict:
    """A PATH without bubblewrap's `bwrap`, as on a machine that lacks the package."""
    return {**os.environ, "PATH": str(tmp)}


def no_vllm_env(tmp: Path) -> dict:
    """vLLM is installed here, so a `sitecustomize` hides it (sys.modules["vllm"] = None makes
    importlib report it missing), as on a machine without it. The one simulated case."""
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["vllm"] = None\n')
    return {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


TOOLS_PY = "def shout(text):\n    return text.upper()\n"
CORPUS_LINE = '{"title": "Velmora", "text": "The lighthouse is 42 m tall."}\n'


BAD_INPUTS = [
    BadInput("unknown group choice", ["algo=nope"],
             "algo=nope is not one of the valid choices for algo: cispo, clip_cov, dapo, dcpo, "
             "dpo, dr_grpo, dupo, gmpo, gpg, grpo, gspo, gspo_token, kl_cov, luspo, opo, ppo, "
             "reinforce_pp, reinforce_pp_baseline, remax, rloo, sapo."),
    BadInput("unknown key", ["trainer.max_stpes=3"],
             "trainer.max_stpes is not a config key: trainer has no 'max_stpes'. Did you mean "
             "trainer.max_steps?"),
    BadInput("wrong type", ["trainer.max_steps=ten"],
             "Invalid config value at trainer.max_steps: Value 'ten' of type 'str' could not "
             "be converted to Integer"),
    BadInput("nan learning rate", ["trainer.lr=nan"], "trainer.lr=nan is not a finite number"),
    BadInput("interpolation that names no key", ["trainer.lr=${nope}"],
             "Invalid config value at trainer.lr: Interpolation key 'nope' not found"),
    BadInput("inf clip bound", ["algo.eps_high=inf"], "algo.eps_high=inf is not a finite number"),
    BadInput("missing data file", ["data=jsonl", "data.path=/nonexistent/train.jsonl"],
             "data.path=/nonexistent/train.jsonl: no such file."),
    BadInput("empty data file", ["data=jsonl", "data.path={tmp}/empty.jsonl"],
             "data.path={tmp}/empty.jsonl holds no records: the file is empty.",
             {"empty.jsonl": ""}),
    BadInput("records missing the configured fields", ["data=jsonl", "data.path={tmp}/f.jsonl"],
             "There is no field 'question' in",
             {"f.jsonl": '{"problem": "1+1?", "answer": "2"}\n' * 3}),
    BadInput("model path that does not exist", ["model.path=/nonexistent/model"],
             "model.path=/nonexistent/model does not exist."),
    BadInput("prompt longer than allowed", ["sampler.max_prompt_tokens=20"],
             "prompts of data=arith are longer than sampler.max_prompt_tokens=20"),
    BadInput("group size 1 for a group-based algorithm", ["algo=grpo", "trainer.group_size=1"],
             "trainer.group_size=1 is too small for algo.advantage=grpo"),
    BadInput("vLLM asked for but not installed", ["sampler=vllm"],
             "sampler=vllm needs vLLM, which is not installed.", env=no_vllm_env),
    BadInput("CUDA asked for but absent", ["trainer.device=cuda"],
             "trainer.device=cuda was asked for but this machine has no CUDA GPU"),
    BadInput("-inf temperature", ["sampler.temperature=-inf"],
             "sampler.temperature=-inf is not a finite number"),
    BadInput("relative model path that does not exist", ["model.path=./no_such_model"],
             "model.path=./no_such_model does not exist (resolved to "),
    BadInput("model directory that is empty", ["model.path={tmp}/empty_model"],
             "model.path={tmp}/empty_model holds no config.json: not a Hugging Face model "
             "directory", {"empty_model": None}),
    BadInput("model path that is a file", ["model.path={tmp}/model.bin"],
             "model.path={tmp}/model.bin is a file, not a directory",
             {"model.bin": b"not a model"}),
    BadInput("hub id not cached, offline", ["model.path=rlcli-tests/no-such-model"],
             "model.path=rlcli-tests/no-such-model is not a local directory (there is no "),
    BadInput("reward model path that does not exist",
             ["reward=reward_model", "reward.model_path=/nonexistent/rm"],
             "reward.model_path=/nonexistent/rm does not exist."),
    BadInput("data file that is not UTF-8", ["data=jsonl", "data.path={tmp}/latin1.jsonl"],
             "data.path={tmp}/latin1.jsonl: line 1 is not UTF-8 text (byte 0xe9 at column 18)",
             {"latin1.jsonl": b'{"question": "caf\xe9?", "answer": "2"}\n'}),
    BadInput("malformed JSON line", ["data=jsonl", "data.path={tmp}/bad.jsonl"],
             "data.path={tmp}/bad.jsonl: line 3 is not valid JSON (Expecting ',' delimiter at "
             "column 21)",
             {"bad.jsonl": '{"question": "1+1?", "answer": "2"}\n' * 2
              + '{"question": "3+3?" "answer": "6"}\n'}),
    BadInput("a directory given as the test file",
             ["data=jsonl", "data.path={tmp}/good.jsonl", "data.test_path={tmp}/dir"],
             "data.test_path={tmp}/dir is a directory, not a file",
             {"good.jsonl": '{"question": "1+1?", "answer": "2"}\n' * 3, "dir": None}),
    BadInput("a directory given as the ptx file",
             ["algo=ppo", "algo.ptx_coef=0.1", "algo.ptx_path={tmp}/dir"],
             "algo.ptx_path={tmp}/dir is a directory, not a file", {"dir": None}),
    BadInput("reward function file that does not exist",
             ["reward=python", "reward.function=/nonexistent/r.py:score"],
             "reward.function='/nonexistent/r.py:score': no such file"),
    BadInput("negative LoRA rank", ["model.lora.rank=-4"],
             "model.lora.rank=-4 must be >= 0 (0 = no LoRA)."),
    BadInput("LoRA layers the model does not have",
             ["model=tiny", "model.lora.rank=4", "model.lora.target_modules=[qkv]"],
             "model.lora.target_modules=[qkv] matches no layer of this model: its linear layers "
             "are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    BadInput("a LoRA checkpoint given as the model", ["model.path={tmp}/adapters"],
             "holds LoRA adapters (a checkpoint of a model.lora run), not a whole model",
             {"adapters": None, "adapters/adapter_config.json": "{}"}),
    BadInput("hub repo id that is not one", ["trainer.push_to_hub=not a repo"],
             "trainer.push_to_hub=not a repo is not a hub repo id"),
    BadInput("LoRA all-linear mixed with layer names",
             ["model.lora.rank=4", "model.lora.target_modules=[all-linear,q_proj]"],
             "model.lora.target_modules=[all-linear,q_proj] mixes all-linear with layer names"),
    BadInput("a LoRA layer name that matches nothing beside one that does",
             ["model.lora.rank=4", "model.lora.target_modules=[q_proj,qkv]"],
             "model.lora.target_modules=[q_proj,qkv]: qkv matches no layer of this model"),
    BadInput("LoRA on an output head tied to the embedding",
             ["model.lora.rank=4", "model.lora.target_modules=[lm_head]"],
             "model.lora.target_modules=[lm_head]: lm_head is tied: it shares its weight with "
             "model.embed_tokens."),
    BadInput("LoRA rank larger than the layer", ["model.lora.rank=65"],
             "model.lora.rank=65 is larger than the layer model.layers.0.self_attn.q_proj "
             "(64x64): an adapter's rank can be at most its smaller side, 64."),
    BadInput("empty hub repo id", ["trainer.push_to_hub=''"],
             "trainer.push_to_hub='' is empty: give the hub repo"),
    BadInput("override Hydra cannot parse", ["trainer.lr=[1,"],
             "'trainer.lr=[1,' is not a valid override (no viable alternative at input '[1,')"),
    BadInput("python tool without bubblewrap", ["env=python"],
             "is not installed here: install the package `bubblewrap`", env=no_bwrap_env),
    BadInput("unknown sandbox", ["env=python", "env.sandbox=docker"],
             "env.sandbox='docker' is not a sandbox: bwrap (bubblewrap, the default) or none"),
    BadInput("user tool file that does not exist",
             ["env=calculator", "env.tools=[nonexistent.py:fn]"],
             "env.tools entry 'nonexistent.py:fn' cannot be used: no such file "),
    BadInput("user tool without a file", ["env=calculator", "env.tools=[:fn]"],
             "env.tools entry ':fn' is not a tool: calculator, python, search, or a function"),
    BadInput("user tool function that is missing",
             ["env=calculator", "env.tools=[{tmp}/tools.py:whisper]"],
             "env.tools entry '{tmp}/tools.py:whisper' cannot be used: {tmp}/tools.py has no "
             "function 'whisper'", {"tools.py": TOOLS_PY}),
    BadInput("user tool module that raises on import",
             ["env=calculator", "env.tools=[{tmp}/boom.py:shout]"],
             "cannot be used: importing {tmp}/boom.py failed: ",
             {"boom.py": "raise RuntimeError('no licence server')\n"}),
    BadInput("python tool memory limit of 0", ["env=python", "env.python_memory_mb=0"],
             "env.python_memory_mb=0 must be at least 1."),
    BadInput("search results per query of 0",
             ["env=search", "env.corpus={tmp}/c.jsonl", "env.search_top_k=0"],
             "env.search_top_k=0 must be at least 1.", {"c.jsonl": CORPUS_LINE}),
    BadInput("corpus without a text field", ["env=search", "env.corpus={tmp}/c.jsonl"],
             'env.corpus={tmp}/c.jsonl: line 2 has no "text" string',
             {"c.jsonl": CORPUS_LINE + '{"title": "Orrin"}\n'}),
    BadInput("corpus with a bad JSON line", ["env=search", "env.corpus={tmp}/c.jsonl"],
             "env.corpus={tmp}/c.jsonl: line 1 is not valid JSON",
             {"c.jsonl": "{'text': 'single quotes'}\n"}),
    BadInput("empty corpus", ["env=search", "env.corpus={tmp}/c.jsonl"],
             "env.corpus={tmp}/c.jsonl holds no documents", {"c.jsonl": "\n"}),
    BadInput("rollout worker URL that is not one", ["sampler=vllm", "sampler.urls=[not-a-url]"],
             "sampler.urls=[not-a-url]: 'not-a-url' is not an http(s) URL; a rollout worker is "
             "named by its HTTP address, http://HOST:PORT or https://HOST:PORT"),
    BadInput("rollout worker URL of another scheme",
             ["sampler=vllm", "sampler.urls=[ftp://node-b/w]"],
             "'ftp://node-b/w' uses ftp://, not http:// or https://"),
    BadInput("rollout worker timeout of 0", ["sampler.worker_timeout_s=0"],
             "sampler.worker_timeout_s=0.0 is not allowed: it is the seconds a rollout worker "
             "may take to start, answer or take new weights, so it must be > 0"),
    BadInput("rollout-server port out of range", ["sampler.serve_port=70000"],
             "sampler.serve_port=70000 is not a TCP port: choose one in 1-65535"),
    BadInput("polynomial schedule with a negative power",
             ["trainer.lr_scheduler=polynomial", "+trainer.lr_scheduler_kwargs.power=-1"],
             "cannot be computed at the scheduler's step after the run's last update"),
    BadInput("polynomial schedule with a warm-up as long as the run",
             ["trainer.lr_scheduler=polynomial", "trainer.warmup_steps=1"],
             "power >= 0 and trainer.warmup_steps below trainer.max_steps"),
    BadInput("polynomial schedule ending below 0",
             ["trainer.lr_scheduler=polynomial", "+trainer.lr_scheduler_kwargs.lr_end=-1e-4"],
             "gives a learning rate of"),
    BadInput("inverse_sqrt schedule with timescale 0",
             ["trainer.lr_scheduler=inverse_sqrt", "+trainer.lr_scheduler_kwargs.timescale=0"],
             "cannot be built: ZeroDivisionError: division by zero. Valid: timescale > 0."),
    BadInput("cosine_with_min_lr with a negative floor",
             ["trainer.lr_scheduler=cosine_with_min_lr",
              "+trainer.lr_scheduler_kwargs.min_lr_rate=-0.5"],
             "trainer.lr_scheduler_kwargs.min_lr_rate=-0.5 is not allowed"),
    BadInput("negative warm-up", ["trainer.warmup_steps=-3"],
             "trainer.warmup_steps=-3 is not allowed"),
    BadInput("one of rlcli's keys deleted", ["~trainer.lr_scheduler"],
             "~trainer.lr_scheduler would delete trainer.lr_scheduler, which every run needs"),
    BadInput("top-entropy tokens with a loss per response", ["algo=gmpo", "algo.top_entropy=0.2"],
             "algo.top_entropy=0.2 chooses the tokens that carry a per-token loss, but "
             "algo.loss=gmpo gives one loss per response"),
    BadInput("an upper clip width under the symmetric clip", ["algo.eps_high=0.28"],
             "algo.eps_high=0.28 would be ignored: algo.clip=symmetric bounds the ratio by "
             "1 +- eps_low on both sides; for a separate upper width use algo.clip=decoupled"),
    BadInput("a clip width for a loss that does not clip", ["algo=gpg", "algo.eps_low=0.1"],
             "algo.eps_low=0.1 would be ignored: algo.loss=gpg reads only advantages, logp, so "
             "it never uses algo.eps_low"),
    BadInput("several epochs of a loss with no ratio", ["algo=gpg", "trainer.epochs=2"],
             "algo.loss=gpg reads no importance ratio (neither ratio nor old_logp)"),
    BadInput("a temperature of 0 for SAPO's gate", ["algo=sapo", "algo.loss_settings.tau_pos=0"],
             "algo.loss_settings.tau_pos=0 must be > 0."),
    BadInput("an own loss that returns one number", ["algo.loss={tmp}/own.py:total"],
             "algo.loss={tmp}/own.py:total returned a loss of shape [] where [4, 3] was expected",
             {"own.py": "def total(*, ratio, advantages):\n"
                        "    return (-ratio * advantages).sum(), {}\n"}),
    BadInput("an own estimator that raises", ["algo.advantage={tmp}/own.py:centred"],
             "algo.advantage={tmp}/own.py:centred raised ZeroDivisionError: division by zero at",
             {"own.py": "def centred(x):\n    return 1 / 0\n"}),
    BadInput("a batch-wide estimator under torchrun", ["algo=reinforce_pp"],
             "algo.advantage=reinforce_pp (statistics over the whole batch: whitening, counts "
             "of flat groups) runs in one process only for now, but torchrun started 2",
             env=lambda tmp: {**os.environ, "WORLD_SIZE": "2"}),
    BadInput('conversation with an unknown role',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.1.role is a string ("usr"), which is n'
             'ot a chat role: the valid roles are system, user, assistant, tool.',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": "2+3?"}, {"role": "usr", "content": "Go"}], "answer": '
                          '"5"}\n'}),
    BadInput('conversation with an image content part',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.0.content.0.type is a string ("image")'
             ': the only valid content part is {"type": "text", "text": "..."}',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": [{"type": "image", "image": "cat.png"}]}],'
                          ' "answer": "5"}\n'}),
    BadInput('conversation with a content part that is not an object',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.0.content.0 is a string ("2+3?"); a co'
             'ntent part is an object: {"type": "text", "text": "..."}.',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": ["2+3?"]}], "answer": "5"}\n'}),
    BadInput('conversation with a text part whose text is not text',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.0.content.0.text is a number (5), not '
             'text.',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": [{"type": "text", "text": 5}]}], "answer": "5"}\n'}),
    BadInput('conversation whose tool_calls is not a list',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.1.tool_calls is an object ({"name": "a'
             'dd"}); tool_calls is a list of calls',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": "2+3?"}, {"role": "assistant", "content": null, "tool_calls'
                          '": {"name": "add"}}, {"role": "user", "content": "2+3?"}], "answer": "5'
                          '"}\n'}),
    BadInput('conversation with tool_calls on a user message',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.0.tool_calls is on a user message; onl'
             'y an assistant message makes tool calls',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": "2+3?", "tool_calls": [{"type": "function", "function": {"n'
                          'ame": "add"}}]}], "answer": "5"}\n'}),
    BadInput('conversation item that is not a message',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.1 is a string ("and 4?"), not a chat m'
             'essage; give each message as an object',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": "2+3?"}, "and 4?"], "answer": "5"}\n'}),
    BadInput('conversation message without content',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.0.content is missing; only an assistan'
             't message with tool_calls may have no content',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user"}'
                          '], "answer": "5"}\n'}),
    BadInput('conversation user message with null content',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, question.0.content is null; only an assistant m'
             'essage with tool_calls may have no content',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": null}], "answer": "5"}\n'}),
    BadInput('conversation message content that is a number',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             "In row 1 of data.path={tmp}/c.jsonl, question.0.content is a number (7); a message's"
             ' content is text, or a list of text parts',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": 7}], "answer": "5"}\n'}),
    BadInput('conversation tool message whose name is not text',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             "In row 1 of data.path={tmp}/c.jsonl, question.1.name is a number (7); a message's na"
             'me is text.',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": "2+3?"}, {"role": "tool", "content": "5", "name": 7}], "ans'
                          'wer": "5"}\n'}),
    BadInput('conversation with no user message',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, data.prompt_field=question is a list with no us'
             'er message',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "system'
                          '", "content": "Be brief."}], "answer": "5"}\n'}),
    BadInput('conversation that ends with a tool call',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 1 of data.path={tmp}/c.jsonl, the conversation ends with an assistant message'
             ' (question.1) that holds no text to continue',
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": [{"role": "user",'
                          ' "content": "2+3?"}, {"role": "assistant", "content": null, "tool_calls'
                          '": [{"type": "function", "function": {"name": "add", "arguments": {}}}]'
                          '}], "answer": "5"}\n'}),
    BadInput('conversation the chat template cannot render',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             "cannot render the conversation of problem 'jsonl-train-0' (TypeError: can only conca"
             'tenate str (not "NoneType") to str).',
             {'c.jsonl': '{"question": [{"role": "user", "content": "2+3?"}, {"role": "assistant"'
                          ', "content": null, "tool_calls": [{"type": "function", "function": {"na'
                          'me": "add", "arguments": {"a": 2, "b": 3}}}]}, {"role": "tool", "conten'
                          't": "5", "tool_call_id": "c1", "name": "add"}, {"role": "user", "conten'
                          't": "Thanks. And 5+4?"}], "answer": "9"}\n{"question": [{"role": "u'
                          'ser", "content": "2+3?"}, {"role": "assistant", "content": null, "tool_'
                          'calls": [{"type": "function", "function": {"name": "add", "arguments": '
                          '{"a": 2, "b": 3}}}]}, {"role": "tool", "content": "5", "tool_call_id": '
                          '"c1", "name": "add"}, {"role": "user", "content": "Thanks. And 5+4?"}],'
                          ' "answer": "9"}\n{"question": [{"role": "user", "content": "2+3?"},'
                          ' {"role": "assistant", "content": null, "tool_calls": [{"type": "functi'
                          'on", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}, {"r'
                          'ole": "tool", "content": "5", "tool_call_id": "c1", "name": "add"}, {"r'
                          'ole": "user", "content": "Thanks. And 5+4?"}], "answer": "9"}\n'}),
    BadInput('null prompt',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             "The field 'question' (data.prompt_field) is null in row 1 of data.path={tmp}/c.jsonl",
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": null, "answer": '
                          '"5"}\n'}),
    BadInput('prompt that is an object',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 0 of data.path={tmp}/c.jsonl, data.prompt_field=question is an object ({"text'
             '": "2+3?"}), not a prompt: a prompt is text or a list of chat messages',
             {'c.jsonl': '{"question": {"text": "2+3?"}, "answer": "5"}\n{"question": {"text"'
                          ': "2+3?"}, "answer": "5"}\n'}),
    BadInput('prompt that is a boolean',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 0 of data.path={tmp}/c.jsonl, data.prompt_field=question is a boolean (true),'
             ' not a prompt',
             {'c.jsonl': '{"question": true, "answer": "5"}\n{"question": true, "answer": "5"}\n'}),
    BadInput('prompt that is a number',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 0 of data.path={tmp}/c.jsonl, data.prompt_field=question is a number (12), no'
             't a prompt',
             {'c.jsonl': '{"question": 12, "answer": "5"}\n{"question": 12, "answer": "5"}\n'}),
    BadInput('null answer',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             "The field 'answer' (data.answer_field) is null in row 1 of data.path={tmp}/c.jsonl",
             {'c.jsonl': '{"question": "1+1?", "answer": "2"}\n{"question": "2+3?", "answer":'
                          ' null}\n'}),
    BadInput('answer that is a list',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 0 of data.path={tmp}/c.jsonl, data.answer_field=answer is a list (["5"]), not'
             ' an answer: an answer is text or a number',
             {'c.jsonl': '{"question": "2+3?", "answer": ["5"]}\n{"question": "2+3?", "answer'
                          '": ["5"]}\n'}),
    BadInput('answer that is a boolean',
             ['data=jsonl', 'data.path={tmp}/c.jsonl'],
             'In row 0 of data.path={tmp}/c.jsonl, data.answer_field=answer is a boolean (true), n'
             'ot an answer',
             {'c.jsonl': '{"question": "2+3?", "answer": true}\n{"question": "2+3?", "answer"'
                          ': true}\n'}),
    BadInput('CSV quote never closed, rows merged',
             ['data=jsonl', 'data.path={tmp}/q.csv'],
             'data.path={tmp}/q.csv: a double-quoted value opened in the row on line 3 runs on to '
             'line 4, where its closing quote has more text after it: most likely a quote on line '
             '3 is never closed',
             {'q.csv': 'question,answer\n"What is 1+1?",2\n"What is 1+3?,4\n"What is 2+2?",4\n'}),
    BadInput('CSV quote never closed to the end of the file',
             ['data=jsonl', 'data.path={tmp}/q.csv'],
             'data.path={tmp}/q.csv: the row that starts on line 3 opens a double-quoted value tha'
             't is never closed: the file ends inside it.',
             {'q.csv': 'question,answer\nWhat is 1+1?,2\n"What is 1+3?,4\nWhat is 2+2?,4\n'}),
    BadInput('CSV row with an extra value',
             ['data=jsonl', 'data.path={tmp}/q.csv'],
             "data.path={tmp}/q.csv: line 3 has 3 values ('What is 1', '000 + 1?', '1001') where t"
             'he header (line 1) has 2 columns (question, answer); most likely a comma inside a va'
             'lue that is not in double quotes splits it in two.',
             {'q.csv': 'question,answer\nWhat is 1+1?,2\nWhat is 1,000 + 1?,1001\n'}),
    BadInput('CSV row missing a value',
             ['data=jsonl', 'data.path={tmp}/q.csv'],
             "data.path={tmp}/q.csv: line 3 has 1 value ('What is 2+2?') where the header (line 1)"
             ' has 2 columns (question, answer); most likely a value is missing',
             {'q.csv': 'question,answer\nWhat is 1+1?,2\nWhat is 2+2?\n'}),
    BadInput('CSV rows each ending in a comma',
             ['data=jsonl', 'data.path={tmp}/q.csv'],
             "data.path={tmp}/q.csv: line 2 has 3 values ('What is 1+1?', '2', '') where the heade"
             'r (line 1) has 2 columns',
             {'q.csv': 'question,answer\nWhat is 1+1?,2,\nWhat is 2+2?,4,\n'}),
    BadInput('CSV text after a closing quote',
             ['data=jsonl', 'data.path={tmp}/q.csv'],
             'data.path={tmp}/q.csv: line 2 has text after the closing quote of a double-quoted va'
             'lue.',
             {'q.csv': 'question,answer\n"What is" 1+1?,2\n'}),
    BadInput('CSV with a header and no rows',
             ['data=jsonl', 'data.path={tmp}/q.csv'],
             'data.path={tmp}/q.csv holds no records: the header (line 1: question, answer) has no'
             ' rows under it.',
             {'q.csv': 'question,answer\n'}),
    BadInput('JSONL line that is not JSON',
             ['data=jsonl', 'data.path={tmp}/bad.jsonl'],
             'data.path={tmp}/bad.jsonl: line 2 is not valid JSON (Expecting property name enclose'
             'd in double quotes at column 24). A .jsonl file holds one JSON object per record',
             {'bad.jsonl': '{"question": "What is 1 + 1?", "answer": "2"}\n{"question": "2 + '
                            '2?", answer: "4"}\n'}),
    BadInput('JSONL line that is a list',
             ['data=jsonl', 'data.path={tmp}/l.jsonl'],
             'data.path={tmp}/l.jsonl: line 2 holds a JSON string inside a list, not a record (an '
             'object).',
             {'l.jsonl': '{"question": "What is 1 + 1?", "answer": "2"}\n["What is 2 + 2?", '
                          '"4"]\n'}),
    BadInput('JSONL line that is null',
             ['data=jsonl', 'data.path={tmp}/n.jsonl'],
             'data.path={tmp}/n.jsonl: line 2 holds a JSON null, not a record (an object).',
             {'n.jsonl': '{"question": "What is 1 + 1?", "answer": "2"}\nnull\n{"question": "W'
                          'hat is 1 + 1?", "answer": "2"}\n'}),
    BadInput('JSON file that is a number',
             ['data=jsonl', 'data.path={tmp}/n.json'],
             'data.path={tmp}/n.json: line 1 holds a JSON number, not a record (an object).',
             {'n.json': '42\n'}),
    BadInput('JSON list of numbers',
             ['data=jsonl', 'data.path={tmp}/l.json'],
             'data.path={tmp}/l.json: line 1 holds a JSON number inside a list, not a record',
             {'l.json': '[1, 2, 3]\n'}),
    BadInput('JSON file holding an empty list',
             ['data=jsonl', 'data.path={tmp}/e.json'],
             'data.path={tmp}/e.json holds no records: the file holds only an empty list.',
             {'e.json': '[]\n'}),
    BadInput('parquet file that is corrupt',
             ['data=parquet', 'data.path={tmp}/rows.parquet'],
             'data.path={tmp}/rows.parquet could not be read as parquet records: ',
             {'rows.parquet': b'PAR1' + b'\x00' * 64 + b'PAR1'}),
    BadInput('parquet file cut short',
             ['data=parquet', 'data.path={tmp}/rows.parquet'],
             'The file is cut short or is not parquet: write it again',
             {'rows.parquet': b'PAR1\x15\x04\x15'}),
    BadInput('saved dataset folder missing its arrow file',
             ['data=jsonl', 'data.path={tmp}/saved'],
             'data.path={tmp}/saved could not be read as a saved dataset: its file data-00000-of-0'
             '0001.arrow is missing. The folder is incomplete or damaged',
             {'saved': None,
              'saved/state.json': '{"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "'
                                   '_fingerprint": "0dafc616be949715", "_format_columns": null, "_'
                                   'format_kwargs": {}, "_format_type": null, "_output_all_columns'
                                   '": false, "_split": null}',
              'saved/dataset_info.json': '{"citation": "", "description": "", "features": {"quest'
                                          'ion": {"dtype": "string", "_type": "Value"}, "answer": '
                                          '{"dtype": "string", "_type": "Value"}}, "homepage": "",'
                                          ' "license": ""}'}),
    BadInput('saved dataset folder with a broken dataset_info.json',
             ['data=jsonl', 'data.path={tmp}/saved'],
             'data.path={tmp}/saved could not be read as a saved dataset: its dataset_info.json is'
             ' not valid JSON (Expecting value at line 1, column 14).',
             {'saved': None,
              'saved/state.json': '{"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "'
                                   '_fingerprint": "0dafc616be949715", "_format_columns": null, "_'
                                   'format_kwargs": {}, "_format_type": null, "_output_all_columns'
                                   '": false, "_split": null}',
              'saved/dataset_info.json': '{"features": '}),
    BadInput('non-ASCII path to a missing file',
             ['data=jsonl', 'data.path=/nonexistent/dätä_路径/prøb.jsonl'],
             'data.path=/nonexistent/dätä_路径/prøb.jsonl: no such file.'),
    BadInput('non-ASCII path to a file read as written',
             ['data=jsonl', 'data.path={tmp}/dätä_路径.jsonl'],
             'data.path={tmp}/dätä_路径.jsonl: line 2 holds a JSON null, not a record',
             {'dätä_路径.jsonl': '{"question": "What is 1 + 1?", "answer": "2"}\nnull\n'}),
    BadInput('non-ASCII value rlcli cannot quote',
             ['data=jsonl', 'data.path=${oc.env:HOME}/dätä.jsonl'],
             "'data.path=${oc.env:HOME}/dätä.jsonl' is not a valid override (LexerNoViableAlt"),
]  # fmt: skip


def try_bad_input(case: BadInput, tmp: Path) -> str | None:
    """None when rlcli refused the input cleanly; else what it did instead."""
    for name, content in case.files.items():
        path = tmp / name
        if content is None:
            path.mkdir(parents=True)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    overrides = [o.replace("{tmp}", str(tmp)) for o in case.overrides]
    if case.env is None:
        result = rlcli(tmp / "run", *overrides)
    else:
        result = rlcli_process(tmp / "run", *overrides, env=case.env(tmp))
    expect = case.expect.replace("{tmp}", str(tmp))
    if result.traceback:
        return f"a traceback:\n{result.traceback}"
    if result.code != 2:
        return f"exit code {result.code}, not 2:\n{result.stdout}{result.stderr}"
    if not result.last_line.startswith("rlcli: error: ") or expect not in result.last_line:
        return f"the last line is not the expected error:\n{result.last_line}\nwanted: {expect}"
    if (tmp / "run").exists():  # a refused config leaves nothing behind (only files it made)
        return "it left its run directory behind"
    return None


# Faults: each function tries one and returns None when no run was left silently wrong; its
# docstring's first line is the fault, the rest what rlcli does (the table's columns).
def _metrics_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def second_run_in_the_same_directory(tmp: Path) -> str | None:
    """A second run started in the directory of a running one.
    It exits 2 at once naming the first run's PID; the first finishes with its own results
    (an OS lock, `flock`, which the kernel drops when a run dies, so a killed run blocks
    nothing)."""
    run_dir = tmp / "run"
    command = [sys.executable, "-m", "rlcli", "train", *TINY, "trainer.max_steps=6",
               f"hydra.run.dir={run_dir}"]  # fmt: skip
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while first.poll() is None and time.time() < deadline:
        marker = run_dir / ".rlcli-run"
        if marker.is_file() and str(first.pid) in marker.read_text():
            break
        time.sleep(0.05)
    second = rlcli(run_dir, "trainer.max_steps=4", "trainer.seed=7")
    first_code, first_out = first.wait(timeout=300), first.stdout.read().decode()
    if second.code != 2 or f"(PID {first.pid}," not in second.last_line:
        return f"the second run was not refused by PID: {second.code} {second.last_line}"
    if first_code != 0:
        return f"the first run failed: {first_out}"
    if (
        _metrics_steps(run_dir) != [1, 2, 3, 4, 5, 6]
        or "seed: 0" not in (run_dir / "config.yaml").read_text()
    ):
        return "the first run's results were mixed with the second's"
    return None


def someone_elses_directory(tmp: Path) -> str | None:
    """hydra.run.dir pointing at a folder of unrelated files.
    It exits 2 naming what is there; nothing in it is written, overwritten or deleted."""
    mine = tmp / "mine"
    (mine / "checkpoints" / ".cache").mkdir(parents=True)
    (mine / "config.yaml").write_text("my: own\n")
    result = rlcli(mine)
    if result.code != 2 or "is not an rlcli run directory" not in result.last_line:
        return f"not refused: {result.code} {result.last_line}"
    if (mine / "config.yaml").read_text() != "my: own\n" or not (
        mine / "checkpoints/.cache"
    ).is_dir():
        return "its files were changed"
    return None


def resume_with_another_model(tmp: Path) -> str | None:
    """Resuming with a field that defines the run changed (model, algorithm, data, group size).
    It exits 2 listing each difference (old -> new) and the ways out; config.yaml and the
    checkpoints stay as they were."""
    run_dir = tmp / "run"
    if (first := rlcli(run_dir)).code != 0:
        return f"the first run failed: {first.stderr}"
    before = (run_dir / "config.yaml").read_text()
    result = rlcli(run_dir, "trainer.max_steps=2", "algo=ppo", "model.tiny_hidden=32")
    if result.code != 2 or "model.tiny_hidden: 64 -> 32" not in result.last_line:
        return f"not refused: {result.code} {result.last_line}"
    if (run_dir / "config.yaml").read_text() != before:
        return "config.yaml was rewritten"
    return None


def resume_with_a_new_learning_rate(tmp: Path) -> str | None:
    """Resuming with a new learning rate (or weight decay, warm-up, gradient clip, β, entropy).
    It applies from the next step with a line saying so; config.yaml shows the new value and,
    below it, the history of starts and resumes."""
    run_dir = tmp / "run"
    rlcli(run_dir)
    result = rlcli(run_dir, "trainer.max_steps=2", "trainer.lr=3e-5")
    rates = [
        json.loads(line)["actor/lr"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    config = (run_dir / "config.yaml").read_text()
    if result.code != 0 or "trainer.lr changed since step 1" not in result.stdout:
        return f"no line said so: {result.code} {result.stdout}{result.stderr}"
    if rates != [1e-5, 3e-5] or "lr: 3.0e-05" not in config or "resumed from" not in config:
        return f"the new rate was not applied or not recorded: {rates}"
    return None


def damaged_newest_checkpoint(tmp: Path) -> str | None:
    """The newest checkpoint damaged: optimizer.pt truncated (a model or state file alike).
    Its files are checked against the manifest of sizes and SHA-256 written with it; it is
    renamed step_N.damaged (never deleted) with a line naming what is wrong, and the run goes
    on from the newest sound checkpoint."""
    run_dir = tmp / "run"
    rlcli(run_dir, "trainer.max_steps=2", "trainer.save_every=1")
    optimizer = run_dir / "checkpoints" / "step_2" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:-100])
    result = rlcli(run_dir, "trainer.max_steps=3", "trainer.save_every=1")
    if result.code != 0 or "step_2 is damaged: optimizer.pt holds" not in result.stdout:
        return f"not passed over with a line: {result.code} {result.stdout}{result.stderr}"
    if not (run_dir / "checkpoints" / "step_2.damaged" / "optimizer.pt").is_file():
        return "the damaged checkpoint was not kept"
    if _metrics_steps(run_dir) != [1, 2, 3]:
        return f"the steps logged are {_metrics_steps(run_dir)}"
    return None


@contextlib.contextmanager
def small_disk(path: Path, megabytes: int):
    """A real small file system (tmpfs); mounting one needs root."""
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "rlcli-test", str(path)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        raise PermissionError("mounting a small tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def disk_full_while_saving(tmp: Path) -> str | None:
    """The disk fills up: the second checkpoint does not fit.
    It exits 2 naming the path, the space needed and the space free, and that the older
    checkpoints are intact; a failed write leaves no partial directory and deletes nothing."""
    with small_disk(tmp / "disk", 64) as disk:
        result = rlcli(disk / "run", "trainer.max_steps=3", "trainer.save_every=1")
        line = result.last_line
        kept = sorted(p.name for p in (disk / "run" / "checkpoints").iterdir())
    if result.code != 2 or "could not write checkpoint step_2" not in line:
        return f"not a clear error: {result.code} {line} {result.traceback}"
    if "MiB is free there" not in line or "(step_1) are intact" not in line:
        return f"the message lacks the sizes or the older checkpoints: {line}"
    return None if kept == ["step_1"] else f"checkpoints left: {kept}"


def read_only_run_directory(tmp: Path) -> str | None:
    """A run directory on a read-only file system.
    It exits 2 before Hydra starts, naming the directory."""
    with small_disk(tmp / "disk", 8) as disk:
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        result = rlcli(disk / "run")
    if result.code != 2 or "is read-only" not in result.last_line:
        return f"not a clear error: {result.code} {result.last_line} {result.traceback}"
    return None


def finished_run_started_again(tmp: Path) -> str | None:
    """The command of a finished run run again.
    It says the run is finished (and how to train further) before loading any model; exit 0."""
    run_dir = tmp / "run"
    rlcli(run_dir)
    result = rlcli(run_dir)
    if result.code != 0 or "this run is finished" not in result.stdout:
        return f"it did not say so: {result.code} {result.stdout}"
    if "training " in result.stdout:
        return "it loaded the model first"
    return None


MISBEHAVING_REWARD = """
import os, sys, time

def score(prompts, responses, answers, **fields):
    if any(a.endswith("1") for a in answers):
        time.sleep(100)  # a hang
    if any(a.endswith("2") for a in answers):
        sys.exit(3)
    if any(a.endswith("3") for a in answers):
        os._exit(1)  # the worker dies
    return ["1.0" if a.endswith("4") else 1.0 for a in answers]  # a string is no score
"""


def reward_function_that_misbehaves(tmp: Path) -> str | None:
    """A reward function that hangs, calls sys.exit(), kills its process or returns a string.
    Those responses are scored as missing and counted in reward/errors; the others are scored
    and the run finishes (the function runs in a worker process; reward.timeout_s per
    response)."""
    (tmp / "bad_reward.py").write_text(MISBEHAVING_REWARD)
    function = f"reward.function={tmp / 'bad_reward.py'}:score"
    result = rlcli(tmp / "run", "reward=python", function, "reward.timeout_s=0.5",
                   "trainer.max_steps=2")  # fmt: skip
    if result.code != 0:
        return f"the run did not finish: {result.code} {result.last_line} {result.traceback}"
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    errors = sum(r["reward/errors"] for r in rows)
    return None if 0 < errors < 32 else f"reward/errors over the run: {errors} of 32"


def finished_run_rerun_with_a_push_offline(tmp: Path) -> str | None:
    """The command of a finished run run again with trainer.push_to_hub, offline.
    The finished run would push its checkpoint: offline it exits 2 saying so before anything
    loads, and the checkpoint is intact."""
    run_dir = tmp / "run"
    rlcli(run_dir)
    result = rlcli(run_dir, "trainer.push_to_hub=me/x")
    if result.code != 2 or "HF_HUB_OFFLINE is set" not in result.last_line:
        return f"not a clear error: {result.code} {result.last_line} {result.traceback}"
    intact = (run_dir / "checkpoints" / "step_1" / "model.safetensors").is_file()
    return None if intact else "the checkpoint is gone"


def export_to_a_full_disk(tmp: Path) -> str | None:
    """`rlcli export` onto a disk without room for the model.
    It exits 2 naming the directory, and leaves no half-written model there."""
    return _export_onto_a_small_disk(tmp, 4, "cannot be written")


def _export_onto_a_small_disk(tmp: Path, size_mb: int, said: str) -> str | None:
    """`rlcli export` of the tiny model onto a disk of `size_mb` MiB: None when it exits 2 with
    `said` after the output directory and leaves nothing there."""
    from rlcli.runtime.models import resolve_model_path
    from rlcli.validate import compose

    cfg = compose(["model=tiny"])
    model = resolve_model_path(cfg.model, cfg.trainer.seed)  # 12.9 MB of weights, 3.5 of tokenizer
    err, code = io.StringIO(), 0
    with small_disk(tmp / "disk", size_mb) as disk:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                main(["export", model, str(disk / "out")])
            except SystemExit as exit_:
                code = exit_.code
            except Exception:  # noqa: BLE001 - an escaped exception is what we look for
                return f"a traceback:\n{traceback.format_exc()}"
        left = sorted(p.name for p in disk.iterdir())
    line = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
    if code != 2 or f"{disk / 'out'} {said}" not in line:
        return f"not a clear error: {code} {line}"
    return None if not left else f"left on the disk: {left}"


@contextlib.contextmanager
def broken_worker(status: int, kind: str, body: str):
    """A stand-in for a rollout worker gone wrong: an http.server on 127.0.0.1 (a free port)
    that answers every request with `status` and `body`."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's names
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body.encode())))
            self.end_headers()
            self.wfile.write(body.encode())

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _worker_lost_cleanly(result: Result, url: str, run_dir: Path) -> str | None:
    """None when rlcli stopped with exit 4 and a message naming the worker, no traceback."""
    if result.traceback:
        return f"a traceback:\n{result.traceback}"
    if result.code != 4 or f"rlcli: rollout worker 0 ({url})" not in result.stderr:
        return f"not a clear exit 4: {result.code} {result.stderr[-800:]}"
    return "it wrote checkpoints" if (run_dir / "checkpoints").exists() else None


def rollout_worker_that_is_none(tmp: Path) -> str | None:
    """A rollout worker in sampler.urls that answers HTML, `{}` or HTTP 500, or is not there.
    It exits 4 before training, naming the worker and what it answered (a 5xx or a refused
    connection is retried with backoff first); no checkpoint is written."""
    from rlcli.rollout.workers.processes import free_port

    answers = {
        "html": (200, "text/html", "<html><body>Welcome to nginx!</body></html>"),
        "empty": (200, "application/json", "{}"),
        "500": (500, "application/json", '{"error": "Internal Server Error"}'),
    }
    for name, answer in answers.items():
        with broken_worker(*answer) as url:
            result = rlcli(tmp / name, "sampler=vllm", f"sampler.urls=[{url}]")
        if problem := _worker_lost_cleanly(result, url, tmp / name):
            return f"{name}: {problem}"
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = rlcli(tmp / "refused", "sampler=vllm", f"sampler.urls=[{url}]")
    if problem := _worker_lost_cleanly(result, url, tmp / "refused"):
        return f"refused: {problem}"
    return None


def rollout_server_on_a_port_in_use(tmp: Path) -> str | None:
    """`rlcli rollout-server` on a port another process listens on.
    It exits 2 naming the port, before it loads the model or starts vLLM."""
    import socket

    started = []
    real_exec, os.execvpe = os.execvpe, lambda *args: started.append(args)  # never vLLM here
    err, code = io.StringIO(), 0
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            argv = ["rollout-server", "model=tiny", f"sampler.serve_port={port}",
                    f"hydra.run.dir={tmp / 'run'}"]  # fmt: skip
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                try:
                    main(argv)
                except SystemExit as exit_:
                    code = exit_.code
                except Exception:  # noqa: BLE001 - an escaped exception is what we look for
                    return f"a traceback:\n{traceback.format_exc()}"
    finally:
        os.execvpe = real_exec
    line = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
    if started or code != 2 or f"sampler.serve_port={port} is in use" not in line:
        return f"not a clear error: {code} {line} (vLLM started: {bool(started)})"
    return None


def worker_killed_in_the_weight_push(tmp: Path) -> str | None:
    """A local rollout worker killed (SIGKILL) while the learner pushes step 2's weights.
    It exits 4 naming the worker, with step 2 written (metrics, samples) and saved as done;
    the resumed run goes on at step 3, so every step is in metrics.jsonl once."""
    import signal

    from rlcli.rollout.workers.sampler import WorkerSampler
    from rlcli.rollout.workers.weight_push import ParameterSource

    samplers, pushes = [], []
    push, parameters = WorkerSampler._push, ParameterSource.__iter__

    def counted_push(self, policy, version):
        samplers.append(self)
        pushes.append(len(pushes) + 1)  # 1: the setup's, then one per step
        return push(self, policy, version)

    def dying_parameters(self):
        for k, named in enumerate(parameters(self)):
            if pushes == [1, 2, 3] and k == 2:  # step 2's push, a few tensors in
                os.killpg(samplers[-1].local.processes[0].pid, signal.SIGKILL)
            yield named

    WorkerSampler._push, ParameterSource.__iter__ = counted_push, dying_parameters
    run_dir, workers = tmp / "run", ["sampler=vllm", "sampler.workers=1"]
    try:
        lost = rlcli(run_dir, *workers, "trainer.max_steps=3")
        after_loss = _metrics_steps(run_dir)
        resumed = rlcli(run_dir, *workers, "trainer.max_steps=4", "trainer.resume=auto")
    finally:
        WorkerSampler._push, ParameterSource.__iter__ = push, parameters
        for sampler in dict.fromkeys(samplers):
            sampler.close()
    named = "rollout worker 0" in lost.stderr and "stopped after step 2" in lost.stderr
    if lost.traceback or lost.code != 4 or not named or after_loss != [1, 2]:
        return f"not a clear exit 4: {lost.code} {after_loss} {lost.stderr[-800:]} {lost.traceback}"
    if resumed.code != 0 or _metrics_steps(run_dir) != [1, 2, 3, 4]:
        return f"the steps logged are {_metrics_steps(run_dir)} ({resumed.stderr[-800:]})"
    steps = [json.loads(line)["step"] for line in (run_dir / "samples.jsonl").open()]
    if sorted(set(steps)) != [1, 2, 3, 4] or len(steps) != 4 * steps.count(1):
        return f"samples.jsonl holds steps {steps}: not every step's responses once"
    return None


FAULTS: list[Callable[[Path], str | None]] = [
    reward_function_that_misbehaves,
    second_run_in_the_same_directory,
    someone_elses_directory,
    resume_with_another_model,
    resume_with_a_new_learning_rate,
    damaged_newest_checkpoint,
    disk_full_while_saving,
    read_only_run_directory,
    finished_run_started_again,
    finished_run_rerun_with_a_push_offline,
    export_to_a_full_disk,
    rollout_worker_that_is_none,
    rollout_server_on_a_port_in_use,
    worker_killed_in_the_weight_push,
]


def export_whose_tokenizer_does_not_fit(tmp: Path) -> str | None:
    """`rlcli export` onto a disk with room for the weights but not the tokenizer.
    It exits 2 naming the directory and the full disk (the tokenizers library reports it as a
    plain Exception), and leaves no model beside a cut-short tokenizer.json."""
    return _export_onto_a_small_disk(tmp, 15, "cannot be written: No space left")


FAULTS.append(export_whose_tokenizer_does_not_fit)


UNSCORABLE_REWARDS = """
import os, time


def spaces(responses):
    return [r.count(" ") / max(len(r), 1) for r in responses]


def none_after_step_1(prompts, responses, answers, **fields):
    calls = os.path.join(os.path.dirname(__file__), "calls")
    done = int(open(calls).read()) if os.path.exists(calls) else 0
    open(calls, "w").write(str(done + 1))
    return [None] * len(responses) if done else spaces(responses)


def one_per_prompt(prompts, responses, answers, **fields):
    return [1.0] * len(set(map(str, prompts)))  # one score per unique prompt


def none_for_greedy(prompts, responses, answers, **fields):
    return [None] * 3 if len(responses) == 3 else spaces(responses)  # eval.max_problems=3


def slow(prompts, responses, answers, **fields):
    time.sleep(0.2)
    return spaces(responses)


def raises(prompts, responses, answers, **fields):
    raise RuntimeError("the log-only judge is down")


def too_large(prompts, responses, answers, **fields):
    return [1e39] + spaces(responses)[1:]


def a_set(prompts, responses, answers, **fields):
    return set(spaces(responses))
"""


def _unscorable_run(tmp: Path, name: str, *overrides: str) -> tuple[Result, list[dict]]:
    """A run of UNSCORABLE_REWARDS's `name`, and the rows of metrics.jsonl (none if absent)."""
    (tmp / "r.py").write_text(UNSCORABLE_REWARDS)
    result = rlcli(tmp / "run", "reward=python", f"reward.function={tmp / 'r.py'}:{name}",
                   *overrides)  # fmt: skip
    path = tmp / "run" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return result, rows


def reward_that_scores_nothing_at_step_2(tmp: Path) -> str | None:
    """A reward function that returns None for every response from step 2 on.
    The run saves step 1, then exits 2 naming step 2, the reason and the command that resumes."""
    result, _ = _unscorable_run(tmp, "none_after_step_1", "trainer.max_steps=3")
    if result.traceback or result.code != 2:
        return f"exit {result.code}: {result.traceback or result.stderr[-500:]}"
    if not (tmp / "run" / "checkpoints" / "step_1").is_dir():
        return "step 1 was not saved"
    return None if "step 2's batch could be scored" in result.stderr else result.stderr[-500:]


def held_out_evaluation_that_scores_nothing(tmp: Path) -> str | None:
    """A reward function that returns None for every held-out greedy reply.
    A warning names the evaluation's step; its eval/* metrics are left out; training goes on."""
    result, rows = _unscorable_run(tmp, "none_for_greedy", "trainer.eval_every=1",
                                   "eval.max_problems=3", "eval.k=2")  # fmt: skip
    if result.code != 0:
        return f"exit {result.code}: {result.traceback or result.stderr[-500:]}"
    if any(key.startswith("eval/") for row in rows for key in row):
        return "eval/* metrics were logged for an evaluation that scored nothing"
    said = "held-out evaluation at step 1 measured nothing"
    return None if said in result.stdout + result.stderr else "no warning named the evaluation"


def log_only_reward_component_that_raises(tmp: Path) -> str | None:
    """A log-only reward component (weight 0) that raises on every call.
    Training is unaffected: reward/errors stays 0; the failures count in reward/log_only_errors."""
    result, rows = _unscorable_run(tmp, "raises", "reward.components=[space_rate,python]",
                                   "reward.weights=[1,0]")  # fmt: skip
    if result.code != 0:
        return f"exit {result.code}: {result.traceback or result.stderr[-500:]}"
    errors, log_only = rows[-1]["reward/errors"], rows[-1].get("reward/log_only_errors")
    return None if (errors, log_only) == (0, 16) else f"errors {errors}, log-only {log_only}"


def reward_without_a_time_limit(tmp: Path) -> str | None:
    """reward.timeout_s=0, documented as no limit, with a reward function.
    Every response is scored; none times out."""
    result, rows = _unscorable_run(tmp, "slow", "reward.timeout_s=0")
    if result.code != 0:
        return f"exit {result.code}: {result.traceback or result.stderr[-500:]}"
    return None if rows[-1]["reward/errors"] == 0 else f"reward/errors {rows[-1]['reward/errors']}"


def reward_of_1e39_or_a_set(tmp: Path) -> str | None:
    """A reward function that returns 1e39 for one response; one that returns a set.
    1e39 (beyond float32) is a failed score counted in reward/errors and the step trains on the
    rest; a set (no order) is refused like a string: a batch of them stops the run, exit 2."""
    result, rows = _unscorable_run(tmp, "too_large")
    if result.code != 0 or rows[-1]["reward/errors"] != 1:
        return f"1e39: exit {result.code}, rows {rows}"
    if rows[-1]["nonfinite/skipped_updates"]:
        return "1e39 made the step's update non-finite"
    (tmp / "set").mkdir()
    result, _ = _unscorable_run(tmp / "set", "a_set")
    if result.code != 2 or "returned a set, not a list of scores" not in result.stderr:
        return f"a set: exit {result.code}: {result.traceback or result.stderr[-500:]}"
    return None


OWN_LOSS_FAILING_AT_STEP_2 = """
calls = 0

def loss(*, ratio, advantages):
    global calls
    calls += 1  # 1: rlcli's trial on a made-up batch, 2: step 1, 3: step 2
    if calls == 3:
        raise RuntimeError("boom")
    return -ratio * advantages, {}
"""


def own_loss_that_raises_at_step_2(tmp: Path) -> str | None:
    """A researcher's own loss that raises in step 2 (it passed rlcli's trial before loading).
    The run saves step 1, then exits 2 naming the function, the line that raised and the resume."""
    (tmp / "own.py").write_text(OWN_LOSS_FAILING_AT_STEP_2)
    result = rlcli(tmp / "run", f"algo.loss={tmp / 'own.py'}:loss", "trainer.max_steps=3",
                   "trainer.micro_batch_size=64")  # fmt: skip
    if result.traceback or result.code != 2:
        return f"exit {result.code}: {result.traceback or result.stderr[-500:]}"
    if not (tmp / "run" / "checkpoints" / "step_1").is_dir():
        return "step 1 was not saved"
    said = f"In step 2: algo.loss={tmp / 'own.py'}:loss raised RuntimeError: boom at"
    return None if said in result.stderr else result.stderr[-500:]


def trl_reward_with_one_score_per_prompt(tmp: Path) -> str | None:
    """A TRL-style reward that returns one score per unique prompt (4 for 16 responses).
    Not retried response by response (where it would seem to work): exit 2 saying it returned
    4 scores for 16 responses."""
    result, _ = _unscorable_run(tmp, "one_per_prompt", "trainer.max_steps=2")
    if result.traceback or result.code != 2:
        return f"exit {result.code}: {result.traceback or result.stderr[-500:]}"
    said = "one_per_prompt: returned 4 scores for 16 responses"
    return None if said in result.stderr else result.stderr[-500:]


OWN_LOSS_NAN = """
def nan_loss(*, ratio, advantages):
    return -ratio * advantages * float("nan"), {}
"""


def own_loss_that_gives_nan(tmp: Path) -> str | None:
    """A researcher's own loss that returns NaN, with trainer.max_bad_steps=2.
    Each step's warning names the own loss as the first suspect, then the run stops with exit 3."""
    (tmp / "own.py").write_text(OWN_LOSS_NAN)
    result = rlcli(tmp / "run", f"algo.loss={tmp / 'own.py'}:nan_loss", "trainer.max_steps=3",
                   "trainer.max_bad_steps=2")  # fmt: skip
    if result.traceback or result.code != 3:
        return f"exit {result.code}: {result.traceback or result.stderr[-500:]}"
    text = (tmp / "run" / "train.log").read_text()  # the console's lines, the warnings among them
    warnings = [line for line in text.splitlines() if line.startswith("rlcli: warning: step")]
    named = f"Check your own algo.loss={tmp / 'own.py'}:nan_loss first"
    return None if len(warnings) == 2 and all(named in w for w in warnings) else text[-800:]


def ctrl_c_while_a_rollout_worker_starts(tmp: Path) -> str | None:
    """Ctrl-C while a rollout worker starts, in a job started with SIGINT ignored (`... &`).
    The run stops within seconds with exit 130, and no worker is left running."""
    import signal

    command = [sys.executable, "-m", "rlcli", "train", *TINY, "sampler=vllm", "sampler.workers=1",
               "trainer.max_steps=20", f"hydra.run.dir={tmp / 'run'}"]  # fmt: skip
    ignored = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ignored)  # fmt: skip
    log = tmp / "run" / "workers" / "worker-0.log"
    deadline = time.monotonic() + 120
    while not log.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    began = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    if proc.returncode != 130 or "Traceback" in stdout + stderr:
        return f"exit {proc.returncode}: {stderr[-500:]}"
    if time.monotonic() - began > 30:
        return f"it took {time.monotonic() - began:.0f} s to stop"
    found = subprocess.run(["pgrep", "-f", str(tmp / "run")], capture_output=True, text=True)
    return f"processes left: {found.stdout}" if found.stdout.strip() else None


FAULTS += [
    trl_reward_with_one_score_per_prompt,
    own_loss_that_gives_nan,
    ctrl_c_while_a_rollout_worker_starts,
    own_loss_that_raises_at_step_2,
    reward_that_scores_nothing_at_step_2,
    held_out_evaluation_that_scores_nothing,
    log_only_reward_component_that_raises,
    reward_without_a_time_limit,
    reward_of_1e39_or_a_set,
]


def describe_fault(fault: Callable) -> tuple[str, str]:
    """(the fault, what rlcli does) from the function's docstring."""
    first, _, rest = fault.__doc__.strip().partition("\n")
    return first.strip(), " ".join(rest.split())


# The documentation page that shows the table, and the lines around the part this script owns.
DOCS_PAGE = REPO / "docs" / "reliability.md"
TABLE_BEGIN = "<!-- table written by scripts/bad_input.py: do not edit by hand -->"
TABLE_END = "<!-- end of the table written by scripts/bad_input.py -->"


def write_table(page: Path, text: str) -> None:
    """Put `text` between the page's TABLE_BEGIN and TABLE_END lines, leaving the rest as is."""
    before, begin, rest = page.read_text().partition(TABLE_BEGIN + "\n")
    _, end, after = rest.partition(TABLE_END)
    if not (begin and end):
        raise SystemExit(f"{page} has no table region: add the lines {TABLE_BEGIN} and {TABLE_END}")
    page.write_text(f"{before}{TABLE_BEGIN}\n{text}\n{TABLE_END}{after}")


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the cases whose name holds this")
    args = parser.parse_args(argv)
    rows, clean, tracebacks, silent = [], 0, 0, 0
    bad = [c for c in BAD_INPUTS if not args.only or args.only in c.name]
    if torch.cuda.is_available():  # asking for CUDA is then no error
        bad = [c for c in bad if not c.name.startswith("CUDA")]
    faults = [f for f in FAULTS if not args.only or args.only in f.__name__]
    for case in bad:
        with tempfile.TemporaryDirectory() as tmp:
            problem = try_bad_input(case, Path(tmp))
        clean += problem is None
        tracebacks += bool(problem and problem.startswith("a traceback"))
        rows.append(f"| bad input | {case.name} (`{' '.join(case.overrides)}`) | exit 2: "
                    f"{case.expect} | {'ok' if problem is None else 'FAILED'} |")  # fmt: skip
        if problem:
            print(f"{case.name}: {problem}", file=sys.stderr)
    for fault in faults:
        with tempfile.TemporaryDirectory() as tmp:
            problem = fault(Path(tmp))
        silent += problem is not None
        what, does = describe_fault(fault)
        rows.append(f"| fault | {what} | {does} | {'ok' if problem is None else 'FAILED'} |")
        if problem:
            print(f"{fault.__name__}: {problem}", file=sys.stderr)
    table = "\n".join(["| kind | case | what rlcli does | result |", "|---|---|---|---|", *rows])
    tally = (f"{len(bad)} bad inputs, {clean} clean errors, {tracebacks} tracebacks; "
             f"{len(faults)} faults, {silent} runs silently wrong")  # fmt: skip
    print(f"{table}\n\n{tally}")
    if not args.only:  # the whole table: the page shows it
        write_table(DOCS_PAGE, f"**{tally}**\n\n{table}")
        print(f"written into {DOCS_PAGE.relative_to(REPO)}")
    return 0 if clean == len(bad) and silent == 0 else 1


if __name__ == "__main__":
    sys.exit(main_())
