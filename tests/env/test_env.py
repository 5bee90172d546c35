"""Multi-turn episodes with tools (env=...): the tools and their limits, the python tool's
sandbox, the episode mechanics and masks, the loss that never sees tool tokens, and real runs
with vLLM."""

import contextlib
import math
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from rlcli.commands.recipes import RECIPES_DIR
from rlcli.config import ConfigError
from rlcli.env.calls import CALL_END, parse_call
from rlcli.env.episode import Turn, episode_metrics
from rlcli.env.sandbox import OUTPUT_BYTES, run_function, run_python
from rlcli.env.tools import Search, Toolbox, calculator
from rlcli.rollout.multiturn import EpisodeSampler
from rlcli.runtime.models import load_tokenizer
from rlcli.train.loop import train
from rlcli.train.start_warnings import start_warnings
from rlcli.validate import compose, section
from tests.conftest import FIXTURES, tiny

CORPUS = RECIPES_DIR / "data" / "search_corpus.jsonl"


def env_section(choice="calculator", **values):
    return section("env", choice, **values)


# --- the tools --------------------------------------------------------------------------------


def test_calculator_is_exact_and_refuses_what_is_not_arithmetic():
    assert calculator("12345 * 67890").text == str(12345 * 67890)
    assert calculator("2 + 3 × 4 ^ 2").text == "50"  # × and ^ read as * and **
    assert calculator("7 / 2").text == "3.5" and calculator("8 / 2").text == "4"
    too_big = "((10 ** 999) ** 1000) ** 1000"  # refused before it is computed
    for bad in (
        "__import__('os').system('ls')",
        "open('x')",
        "2 ** 99999",
        "1 / 0",
        "2 +",
        too_big,
    ):
        result = calculator(bad)
        assert result.error and result.text.startswith("Error:"), bad


def test_a_call_is_read_from_the_end_of_a_turn():
    assert parse_call("Let me see. <tool>calculator</tool><args>2*3</args>") == (
        "calculator",
        "2*3",
    )
    assert parse_call("<tool> python </tool>\n<args>\nprint(1)\n</args>") == ("python", "print(1)")
    assert parse_call("no tag<args>2*3</args>").startswith("Error:")


def test_search_finds_the_document_that_holds_the_answer():
    search = Search(str(CORPUS), top_k=1)
    # Without numba, whose llvmlite objects break the next vLLM engine start in this process.
    assert "llvmlite" not in sys.modules
    first = CORPUS.read_text().splitlines()[0]  # {"title": "Braela", ... founded in 1809 ...}
    assert "Braela" in first and "1809" in first
    hit = search("When was the town of Braela founded?").text
    assert hit.startswith("[1] Braela:") and "1809" in hit and "\n" not in hit
    assert search("the of and").text == "No results."  # stop words only


def test_toolbox_cuts_output_and_names_the_tools_on_a_wrong_call():
    box = Toolbox(env_section(tool_output_chars=10))
    long = box.call("<tool>calculator</tool><args>10 ** 50</args>")
    assert (long.tool, long.input) == ("calculator", "10 ** 50")
    assert long.result.text == "1" + "0" * 9 + " [cut]" and not long.result.error
    wrong = box.call("<tool>calc</tool><args>1+1</args>").result
    assert wrong.error and "no tool named 'calc'; the tools are calculator" in wrong.text


def test_user_tool_runs_in_its_own_process_and_a_hang_is_contained(tmp_path):
    (tmp_path / "tools.py").write_text(
        "import time\n"
        "def shout(text):\n    return text.upper()\n"
        "def hang(text):\n    time.sleep(60)\n"
    )
    assert run_function(f"{tmp_path}/tools.py:shout", "hi", 10).text == "HI"
    start = time.monotonic()
    hung = run_function(f"{tmp_path}/tools.py:hang", "", 1)
    assert hung.timeout and time.monotonic() - start < 5


def test_a_user_tool_that_raises_shows_the_users_own_error(tmp_path):
    (tmp_path / "tools.py").write_text("def lookup(key):\n    return {'a': 1}[key]\n")
    failed = run_function(f"{tmp_path}/tools.py:lookup", "b", 10)
    assert failed.error and failed.text.endswith("KeyError: 'b'"), failed.text
    assert 'tools.py", line 2, in lookup' in failed.text and "sandbox_child" not in failed.text


# --- the python tool's sandbox ----------------------------------------------------------------


def test_python_tool_returns_what_the_code_prints_and_keeps_files_in_its_own_directory():
    done = run_python(
        "open('n.txt', 'w').write('41')\nprint(int(open('n.txt').read()) + 1)", 5, 512
    )
    assert (done.text, done.error, done.timeout) == ("42", False, False)
    again = run_python("import os; print(os.listdir('.'))", 5, 512)
    assert again.text == "[]"  # a fresh directory per call


def test_python_tool_contains_a_hang_a_crash_a_flood_and_a_memory_hog():
    start = time.monotonic()
    hang = run_python("while True: pass", 1, 512)
    assert hang.timeout and "stopped after 1 s" in hang.text and time.monotonic() - start < 5
    crash = run_python("import os; os.abort()", 5, 512)
    assert crash.error and "SIGABRT" in crash.text
    start = time.monotonic()
    flood = run_python("print('x' * 10_000_000)", 5, 512)  # 10 MB
    assert flood.error and f"output over {OUTPUT_BYTES // 1024} KiB" in flood.text
    assert len(flood.text) < 1000 and time.monotonic() - start < 5
    hog = run_python("x = bytearray(2 * 1024**3)", 5, 512)  # 2 GiB against a 512 MiB limit
    assert hog.error and "MemoryError" in hog.text


@pytest.mark.parametrize(
    "code, refused",
    [
        ("import socket; socket.create_connection(('pypi.org', 443), timeout=2)", "socket"),
        ("import urllib.request; urllib.request.urlopen('http://127.0.0.1:1')", "socket"),
        ("import subprocess; subprocess.run(['ls'])", "subprocess"),
        ("import os; os.system('ls')", "os.system"),
    ],
)
def test_python_tool_says_plainly_what_it_refuses(code, refused):
    """The audit hook's messages, clearer than the box's bare errors (tests/env/test_sandbox.py
    shows the box holding with the hook switched off)."""
    done = run_python(code, 5, 512)
    assert done.error and "sandbox refuses" in done.text and refused in done.text, done.text


def test_python_tool_cannot_see_the_run_directory(tmp_path):
    secret = tmp_path / "checkpoint.txt"
    secret.write_text("weights")
    read = run_python(f"print(open({str(secret)!r}).read())", 5, 512)
    assert read.error and "FileNotFoundError" in read.text and "weights" not in read.text
    write = run_python(f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')", 5, 512)
    assert write.error and not (tmp_path / "new.txt").exists()
    gone = run_python(f"import os; os.remove({str(secret)!r})", 5, 512)
    assert gone.error and secret.read_text() == "weights"


def test_python_tool_imports_the_installed_packages():
    done = run_python("import numpy, sympy; print(sympy.factorint(2**16 + 1))", 10, 1024)
    assert done.text == "{65537: 1}", done.text


def test_unsandboxed_python_tool_still_has_its_limits_and_hook():
    """env.sandbox=none: no box, the old obstacles (not a sandbox; docs/tools.md says so)."""
    hang = run_python("while True: pass", 1, 512, sandbox="none")
    assert hang.timeout
    refused = run_python("import ctypes; ctypes.CDLL(None)", 5, 512, sandbox="none")
    assert refused.error and "sandbox refuses ctypes" in refused.text


def test_a_run_with_env_sandbox_none_says_it_is_unsafe(tmp_path, capfd):
    """The escapes the box stops go through env.sandbox=none (45 of 89, as documented): every
    run that gives the model the python tool that way says so when it starts, once, as
    rlcli's other warnings are (the tracker's lines: console and train.log)."""
    overrides = ["env=python", "env.sandbox=none", "trainer.max_steps=1",
                 "trainer.prompts_per_step=1", "trainer.group_size=2"]  # fmt: skip
    train(compose(tiny(*overrides)), tmp_path / "run")
    out, err = capfd.readouterr()
    said = [line for line in (out + err).splitlines() if "unsafe" in line]
    assert len(said) == 1 and said[0].startswith("rlcli: warning: env.sandbox=none"), said
    assert start_warnings(compose(tiny("env=python"))) == []  # in the box: nothing to say
    assert start_warnings(compose(tiny("env=calculator", "env.sandbox=none"))) == []  # no code


def test_the_sandbox_has_a_network_namespace_of_its_own():
    """Below the audit hook: the kernel's own isolation (where it allows a namespace; this
    machine does, as root and as a user with user namespaces)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    probe = textwrap.dedent(f"""
        import socket, sys
        sys.path.insert(0, {str(RECIPES_DIR.parent / "rlcli" / "env")!r})
        import sandbox_child
        socket.create_connection(("127.0.0.1", {port}), timeout=2).close()  # reachable before
        sandbox_child.isolate_network()
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
            print("reached")
        except OSError as err:
            print("unreachable", err.errno)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    server.close()
    assert done.stdout.startswith("unreachable"), done.stdout + done.stderr


# --- episodes: a scripted model ---------------------------------------------------------------


class ScriptedEngine:
    """A stand-in for the sampler's engine that replies with scripted text, turn by turn, per
    prompt: the only way to pin down every path of the episode loop (a call, no call, one
    past the last turn, a turn cut at its budget, a wrong call). A tokenizer-level stub, for
    the mechanics test only; the runs below use real models."""

    device = torch.device("cpu")

    def __init__(self, tokenizer, scripts: dict[int, list[str]]):
        self.tokenizer, self.scripts, self.calls = tokenizer, scripts, []
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def seeded(self, seed=None):
        return contextlib.nullcontext()

    def metrics(self):
        return {}

    def turns(self, contexts, budgets, stop, temperature=None, top_p=None):
        self.calls.append(len(contexts))
        out = []
        for context, budget in zip(contexts, budgets, strict=True):
            episode = next(
                k for k in self.scripts if context[: len(self.prompts[k])] == self.prompts[k]
            )
            text = self.scripts[episode].pop(0)
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
            if len(ids) > budget:
                out.append(Turn(ids[:budget], None, "length"))
            elif text.endswith(stop[0]):
                out.append(Turn(ids, None, "call"))
            else:
                out.append(Turn([*ids, self.eos], None, "eos"))
        return out


CALL = "<tool>calculator</tool><args>12345 * 6789</args>"


def test_episode_turns_masks_and_truncation(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    scripts = {
        0: [f"Let me compute. {CALL}", "Done, thanks."],  # call, read, answer
        1: ["It is 4."],  # no call
        2: [CALL, CALL, CALL],  # a call in the last turn is not run
        3: ["word " * 40],  # cut at the turn's budget
        4: ["<tool>abacus</tool><args>1+1</args>", "Fine."],  # a wrong tool name
    }
    engine = ScriptedEngine(tokenizer, scripts)
    env = env_section(max_turns=3, max_tokens=120)
    sampler_cfg = section("sampler", "hf", max_new_tokens=32, max_model_len=512)
    sampler = EpisodeSampler(engine, tokenizer, env, sampler_cfg)
    prompts = [
        f"<|im_start|>user\nquestion {i}<|im_end|>\n<|im_start|>assistant\n" for i in scripts
    ]
    engine.prompts = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    batch = sampler.sample(prompts, 1, [str(i) for i in scripts], ["83810205"] * 5)

    assert engine.calls == [5, 3, 1]  # every open episode advances in one call per turn
    tool_text = sampler.before + str(12345 * 6789) + sampler.after
    tool_ids = tokenizer(tool_text, add_special_tokens=False).input_ids
    turn1 = tokenizer(f"Let me compute. {CALL}", add_special_tokens=False).input_ids
    turn2 = tokenizer("Done, thanks.", add_special_tokens=False).input_ids + [engine.eos]
    n = len(turn1) + len(tool_ids) + len(turn2)
    # Episode 0: the model's turns, the tool turn between them, masked out of the loss only.
    assert batch.response_ids[0, :n].tolist() == turn1 + tool_ids + turn2
    assert batch.response_mask[0, :n].tolist() == [1] * len(turn1) + [0] * len(tool_ids) + [
        1
    ] * len(turn2)
    assert batch.attention_mask[0, batch.prompt_width :].sum() == n  # all of it is context
    assert batch.response_mask[0, n:].sum() == 0
    assert batch.texts[0] == f"Let me compute. {CALL}Done, thanks."  # the model's words
    assert (
        "<|im_start|>tool" in tokenizer.decode(tool_ids) and str(12345 * 6789) not in batch.texts[0]
    )
    assert batch.tool_calls.tolist() == [1, 0, 2, 0, 1]
    assert batch.lengths[0] == len(turn1) + len(turn2)  # response length: model tokens only
    assert batch.truncated.tolist() == [False, False, True, True, False]
    assert batch.lengths[3] == 32  # the turn budget
    m = episode_metrics(batch.episodes)
    assert m["env/turns_mean"] == (2 + 1 + 3 + 1 + 2) / 5
    assert (m["env/tool_calls"], m["env/tool_errors"], m["env/timeouts"]) == (4, 1, 0)
    assert m["env/tool_call_rate"] == 3 / 5
    # The transcripts (samples.jsonl's `episode`): every turn in order, which trained.
    first = batch.episodes[0]
    assert first["turns"] == [
        {"role": "assistant", "text": f"Let me compute. {CALL}", "end": "call",
         "tokens": len(turn1), "trained": True},
        {"role": "tool", "tool": "calculator", "input": "12345 * 6789",
         "output": str(12345 * 6789), "error": False, "timeout": False,
         "tokens": len(tool_ids), "trained": False},
        {"role": "assistant", "text": "Done, thanks.", "end": "eos", "tokens": len(turn2),
         "trained": True},
    ]  # fmt: skip
    assert (first["trained_tokens"], first["context_tokens"]) == (
        len(turn1) + len(turn2),
        len(tool_ids),
    )
    assert [e["stopped"] for e in batch.episodes] == [
        "answer", "answer", "max_turns", "length", "answer",
    ]  # fmt: skip
    assert [t["role"] for t in batch.episodes[2]["turns"]] == [
        "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip
    wrong = batch.episodes[4]["turns"][1]
    assert (wrong["tool"], wrong["input"], wrong["error"]) == ("abacus", "1+1", True)
    assert "no tool named 'abacus'" in wrong["output"]
    for e, mask in zip(batch.episodes, batch.response_mask, strict=True):
        trained = sum(t["tokens"] for t in e["turns"] if t["trained"])
        assert e["trained_tokens"] == mask.sum() == trained


def test_an_episode_ends_when_the_tool_output_would_leave_no_room(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = ScriptedEngine(tokenizer, {0: ["<tool>calculator</tool><args>10 ** 300</args>"]})
    env = env_section(max_tokens=40, tool_output_chars=400)
    sampler = EpisodeSampler(engine, tokenizer, env, section("sampler", "hf"))
    prompt = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    engine.prompts = [tokenizer(prompt, add_special_tokens=False).input_ids]
    batch = sampler.sample([prompt], 1, ["0"], ["1"])
    assert batch.truncated.tolist() == [True] and batch.tool_calls.tolist() == [1]
    assert batch.response_mask.sum() == batch.attention_mask[:, batch.prompt_width :].sum()
    (episode,) = batch.episodes
    assert episode["stopped"] == "max_tokens" and episode["context_tokens"] == 0
    tool = episode["turns"][1]
    assert tool["output"] == "1" + "0" * 300 and tool["tokens"] == 0  # run, never read


def test_an_episode_in_the_chat_templates_format_is_the_templates_own_conversation(
    tiny_model_dir,
):
    """env.tool_format=chat_template: the model calls in the template's format, the tool's
    output comes back as a tool message, and prompt + episode are token for token what the
    template writes for that conversation, with only the model's words in the loss. (The
    template, in Qwen2.5's format, is tests/fixtures/tool_chat_template.jinja: no Qwen
    tokenizer can be downloaded here.)"""
    from rlcli.data.problems import PromptRenderer
    from rlcli.env import prompt_tools

    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = (FIXTURES / "tool_chat_template.jinja").read_text()
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12345 * 6789"}}\n'
    call += "</tool_call>"
    engine = ScriptedEngine(tokenizer, {0: [call, "It is 83810205."]})
    env = env_section(tool_format="chat_template")
    sampler = EpisodeSampler(engine, tokenizer, env, section("sampler", "hf"))
    question = "What is 12345 * 6789?"
    tools = prompt_tools(env, tokenizer)  # the schemas every prompt declares
    prompt = PromptRenderer(tokenizer, None, tools)(question)
    engine.prompts = [tokenizer(prompt, add_special_tokens=False).input_ids]
    batch = sampler.sample([prompt], 1, ["0"], ["83810205"])

    conversation = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {
                "name": "calculator", "arguments": {"expression": "12345 * 6789"}}}]},
        {"role": "tool", "content": "83810205"},
        {"role": "assistant", "content": "It is 83810205."},
    ]  # fmt: skip
    written = tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False)
    n = int(batch.attention_mask[0, batch.prompt_width :].sum())
    seen = tokenizer.decode(engine.prompts[0] + batch.response_ids[0, :n].tolist())
    assert seen + "\n" == written  # the template closes the last turn with a newline
    said = tokenizer(call, add_special_tokens=False).input_ids
    tool = tokenizer.decode(batch.response_ids[0, len(said) :].tolist())
    assert tool.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n83810205\n")
    mask = batch.response_mask[0, :n].tolist()
    answer = len(tokenizer("It is 83810205.", add_special_tokens=False).input_ids) + 1
    tool_tokens = n - len(said) - answer
    assert mask == [1] * len(said) + [0] * tool_tokens + [1] * answer
    episode = batch.episodes[0]
    assert [t["role"] for t in episode["turns"]] == ["assistant", "tool", "assistant"]
    assert episode["turns"][1] == {
        "role": "tool", "tool": "calculator", "input": "12345 * 6789", "output": "83810205",
        "error": False, "timeout": False, "tokens": tool_tokens, "trained": False,
    }  # fmt: skip
    assert episode["trained_tokens"] == len(said) + answer
    assert episode["context_tokens"] == tool_tokens


def test_hf_sampler_cuts_a_generated_row_at_the_call_eos_or_budget(tiny_model_dir):
    from rlcli.rollout.hf import HFSampler
    from rlcli.runtime.models import load_causal_lm

    tokenizer = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir, "float32", torch.device("cpu"))
    sampler = HFSampler(model, tokenizer, 1.0, 1.0, 32)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def ids(text):
        return tokenizer(text, add_special_tokens=False).input_ids

    call = ids(f"Now {CALL}")
    turn = sampler._cut([*call, *ids(" and more"), eos, eos], 30, [CALL_END])
    assert (turn.tokens, turn.end) == (call, "call")  # the shortest prefix holding </args>
    said = ids("All done.")
    assert sampler._cut([*said, eos, eos, eos], 30, [CALL_END]).tokens == [*said, eos]
    assert sampler._cut([*said, eos], 30, [CALL_END]).end == "eos"
    cut = sampler._cut([*said, *said, *said], 4, [CALL_END])
    assert (cut.tokens, cut.end) == ([*said, *said, *said][:4], "length")


def test_tool_failures_are_counted_per_batch():
    box = Toolbox(env_section(tools=["python", "calculator"], tool_timeout_s=1))
    results = box.run(
        [
            "<tool>python</tool><args>while True: pass</args>",
            "<tool>python</tool><args>print('x' * 10_000_000)</args>",
            "<tool>python</tool><args>import socket; socket.socket()</args>",
            "<tool>python</tool><args>import os; os._exit(3)</args>",
            "<tool>calculator</tool><args>6 * 7</args>",
        ]
    )
    results = [call.result for call in results]
    assert [r.timeout for r in results] == [True, False, False, False, False]
    assert [r.error for r in results] == [False, True, True, True, False]
    assert results[-1].text == "42"


# --- the loss never sees tool tokens ----------------------------------------------------------


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "dapo", "dupo", "gspo", "dcpo", "ppo"])
def test_tool_tokens_get_no_gradient_and_do_not_move_the_loss(algo):
    from rlcli.ops.objective import policy_objective
    from rlcli.ops.policy_loss import StepCounts
    from rlcli.train.objective_config import objective_from_config

    cfg = compose([f"algo={algo}", "algo.beta=0.04", "algo.kl_in=loss", "algo.entropy_coef=0.01"])
    objective = objective_from_config(cfg.algo, cfg.sampler, norm_len=16)
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0], [1, 0, 0, 1, 1, 1, 0, 0]])  # tool turns: 0
    logp = (-torch.rand(2, 8)).requires_grad_()
    old, ref = logp.detach() - 0.05 * torch.rand(2, 8), logp.detach() - 0.1
    advantages = torch.tensor([[1.0] * 8, [-0.5] * 8]) * torch.rand(2, 8)
    entropy = torch.rand(2, 8).requires_grad_()
    counts = StepCounts(tokens=float(mask.sum()), seqs=2.0, responses=2.0)

    def loss(old_logp, ent):
        value, _ = policy_objective(objective, logp, old_logp, ref, advantages, mask, ent, counts)
        return value

    value = loss(old, entropy)
    value.backward()
    tool = mask == 0
    assert torch.all(logp.grad[tool] == 0) and torch.all(entropy.grad[tool] == 0)
    assert torch.all(logp.grad[~tool] != 0)
    # Whatever the old policy said of the tool tokens, the loss is the same.
    garbage = torch.where(tool, torch.full_like(old, -30.0), old)
    assert torch.equal(loss(garbage, entropy.detach()).detach(), value.detach())


def test_gae_steps_over_tool_turns_as_if_they_were_not_there():
    from rlcli.ops.advantages import gae

    torch.manual_seed(0)
    rewards, values = torch.rand(1, 5), torch.rand(1, 5)
    holes = torch.tensor([[1, 0, 0, 1, 1, 0, 1, 0]])  # model tokens at 0, 3, 4, 6
    spread = torch.zeros(1, 8)
    spread_values = torch.zeros(1, 8)
    spread[0, [0, 3, 4, 6]], spread_values[0, [0, 3, 4, 6]] = rewards[0, :4], values[0, :4]
    packed_adv, packed_ret = gae(rewards[:, :4], values[:, :4], torch.ones(1, 4), 0.9, 0.8)
    adv, ret = gae(spread, spread_values, holes, 0.9, 0.8)
    assert torch.allclose(adv[0, [0, 3, 4, 6]], packed_adv[0]) and adv[holes == 0].abs().sum() == 0
    assert torch.allclose(ret[0, [0, 3, 4, 6]], packed_ret[0])


def test_micro_batches_keep_the_tool_turns_inside_a_response():
    from rlcli.rollout.batch import rollout_from_tokens
    from rlcli.train.passes import micro_batches

    batch = rollout_from_tokens(
        [[5, 6], [7]], [[1, 2, 3, 4, 5], [8, 9]], ["a", "b"], ["0", "1"], 0, "cpu",
        own_masks=[[1, 0, 0, 0, 1], [1, 1]],
    )  # fmt: skip
    [(rows, ids, att, width, mask)] = micro_batches(batch, torch.arange(2), 8)
    first = rows.tolist().index(0)
    assert mask.shape[1] == 5 and mask[first].tolist() == [1, 0, 0, 0, 1]
    assert ids[first, width:].tolist() == [1, 2, 3, 4, 5]


# --- config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env=calculator", "env.tools=[abacus]"], "env.tools entry 'abacus' is not a tool"),
        (["env=search"], "env.corpus=None is not a file"),
        (["env=calculator", "env.tools=[]"], "needs at least one tool"),
        (["env=calculator", "env.max_turns=0"], "env.max_turns=0 must be at least 1"),
        (["env=calculator", "env.tool_format=json"], "env.tool_format='json' is not a tool"),
        (["algo=dpo", "data=pairs", "data.path=p.jsonl", "env=calculator"], "samples nothing"),
    ],
)
def test_bad_env_settings_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        compose(overrides)


def test_pairs_refuse_episodes_before_loading_anything(tmp_path):
    from rlcli.commands.make_pairs import make_pairs

    with pytest.raises(ConfigError, match="a preference pair cannot carry"):
        make_pairs(compose(["model=tiny", "env=calculator"]), tmp_path)


def test_env_none_leaves_the_prompt_and_the_sampler_as_they_were():
    from rlcli.env import system_prompt

    assert system_prompt(None, compose([]).env) is None
    cfg = compose(["env=calculator", "data.system_prompt=Be brief."])
    text = system_prompt(cfg.data.system_prompt, cfg.env)
    assert text.startswith("Be brief.\n\nYou can use tools.") and "- calculator: evaluates" in text


# --- real runs --------------------------------------------------------------------------------


def test_tiny_model_runs_two_multi_turn_grpo_steps_on_vllm_and_hf(tiny_overrides):
    """The tiny random model never writes a call, so this shows the episode path runs end to
    end on both samplers (the SmolLM2 run below makes the calls)."""
    from rlcli.train.run import setup
    from rlcli.train.step import train_step

    for sampler in ("vllm", "hf"):
        run = setup(compose([*tiny_overrides, f"sampler={sampler}", "env=calculator"]))
        assert isinstance(run.sampler, EpisodeSampler)
        before = [p.detach().clone() for p in run.policy.parameters()]
        for _ in range(2):
            metrics = train_step(run)
            assert math.isfinite(metrics["loss/policy"]) and metrics["env/turns_mean"] >= 1
        after = list(run.policy.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_smollm2_calls_the_calculator_in_a_two_step_grpo_run_on_vllm():
    """SmolLM2 with the demo recipe's prompt: episodes call the calculator, read its result
    in a tool turn and go on; a GRPO step trains on them with the tool turns masked."""
    from rlcli.commands.recipes import compose as compose_recipe
    from rlcli.train.run import setup
    from rlcli.train.step import train_step

    # Near-greedy sampling: SmolLM2 calls the tool in ~1 of 4 greedy episodes before training,
    # and in fewer at the recipe's temperature (0.7).
    cfg = compose_recipe(
        ["recipe=demo/grpo_calculator", "sampler.temperature=0.3", "trainer.group_size=4"]
    )
    run = setup(cfg)
    collected = run.collector.next_batch()
    batch = collected.rollout
    calls = batch.tool_calls
    assert calls.sum() > 0, batch.texts
    tool_tokens = batch.attention_mask[:, batch.prompt_width :] - batch.response_mask
    assert torch.all(tool_tokens[calls > 0].sum(-1) > 0) and torch.all(tool_tokens[calls == 0] == 0)
    assert torch.all(batch.sampler_logp[tool_tokens.bool()] == 0)
    # Each transcript holds the call's tool turn, its context tokens those masked out above.
    for episode, calls_made, n in zip(batch.episodes, calls, tool_tokens.sum(-1), strict=True):
        assert episode["calls"] == calls_made and episode["context_tokens"] == n
        if calls_made:
            assert episode["turns"][1]["role"] == "tool" and episode["turns"][1]["output"]
    metrics = train_step(run)  # the tiny model's run above makes two steps; one does here
    assert math.isfinite(metrics["loss/policy"]) and metrics["env/turns_mean"] >= 1


def test_samples_jsonl_holds_each_whole_episode_and_the_table_its_calls(tmp_path, capsys):
    """A real one-step run (tiny model, sampler=hf): each samples.jsonl line of an episode has
    the existing fields and `episode`, its turns and token counts; the console table adds the
    number of calls. (Tool turns in a transcript: the scripted tests above.)"""
    import json

    from rlcli.train.loop import train

    cfg = compose(["model=tiny", "sampler=hf", "env=calculator", "trainer.max_steps=1",
                   "trainer.prompts_per_step=2", "trainer.group_size=2", "env.max_tokens=24",
                   "sampler.max_new_tokens=8", "logger.progress=false",
                   "logger.print_samples_every=1"])  # fmt: skip
    train(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert {"step", "prompt", "response", "reward", "length", "advantage"} <= row.keys()
        episode = row["episode"]
        model_turns = [t for t in episode["turns"] if t["role"] == "assistant"]
        assert model_turns and all(t["trained"] for t in model_turns)
        assert "".join(t["text"] for t in model_turns) == row["response"]
        assert episode["trained_tokens"] == row["length"]
        assert episode["stopped"] in ("answer", "length", "max_turns", "max_tokens")
    out = capsys.readouterr().out
    assert "reward, advantage, length, tool calls)" in out
    assert "calls  prompt" in out


def test_a_single_turn_samples_row_is_as_it_was(tmp_path):
    from rlcli.tracking.samples import sample_rows, samples_table
    from rlcli.tracking.trackers import ScoredSample

    plain = ScoredSample("What is 2+2?", "4", "4", 1.0, "p0", {"math": 1.0}, 2)
    [row] = sample_rows(3, [plain], {("p0", "4"): 0.5})
    assert list(row) == ["step", "problem_id", "prompt", "response", "answer", "reward",
                         "components", "length", "advantage"]  # fmt: skip
    assert "calls" not in samples_table([row])
    episode = {"turns": [], "calls": 2, "errors": 0, "timeouts": 0, "trained_tokens": 2,
               "context_tokens": 9, "stopped": "answer"}  # fmt: skip
    tooled = ScoredSample("What is 2+2?", "4", "4", 1.0, "p0", {}, 2, episode)
    [row] = sample_rows(3, [tooled], {})
    assert row["episode"] == episode
    table = samples_table([row]).splitlines()
    assert table[0].split()[:4] == ["reward", "adv", "len", "calls"]
    assert table[1].split()[:4] == ["1.000", "-", "2", "2"]
