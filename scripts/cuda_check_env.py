"""CUDA checks of the multi-turn path (env=...) on a GPU machine without vLLM: the HF sampler
running episodes on the GPU, two GRPO and two PPO steps with tool turns masked, and the
masked learner's gradients against the CPU's.

  python scripts/cuda_check_env.py      (prints CUDA CHECKS PASSED; needs model=tiny's cache)
"""

import math
import time

import torch

from rlcli.rollout.batch import rollout_from_tokens
from rlcli.train.forward import token_logprobs
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose

print("torch", torch.__version__, torch.cuda.get_device_name(0))
base = [
    "model=tiny",
    "reward=space_rate",
    "sampler=hf",
    "env=calculator",
    "trainer.device=cuda",
    "trainer.prompts_per_step=4",
    "trainer.group_size=4",
    "sampler.max_new_tokens=16",
    "logger.progress=false",
    "env.max_tokens=48",
]
for algo in ("grpo", "ppo"):
    run = setup(compose([*base, f"algo={algo}"]))
    assert run.device.type == "cuda"
    for step in range(2):
        t = time.perf_counter()
        m = train_step(run)
        print(
            algo,
            step,
            {
                k: round(m[k], 4)
                for k in (
                    "loss/policy",
                    "actor/grad_norm",
                    "env/turns_mean",
                    "response/length_mean",
                )
            },
            f"{time.perf_counter() - t:.2f}s",
        )
        assert math.isfinite(m["loss/policy"])

# A batch with tool turns inside responses: the loss's gradient on CUDA equals the CPU's.

grads = {}
for device in ("cpu", "cuda"):
    run = setup(compose([*base, f"trainer.device={device}", "trainer.bf16_autocast=false"]))
    torch.manual_seed(0)
    prompts = [[1, 2, 3], [4, 5]]
    responses = [[10, 11, 12, 13, 14, 15], [16, 17, 18, 19]]
    masks = [[1, 1, 0, 0, 1, 1], [1, 0, 1, 1]]
    batch = rollout_from_tokens(
        prompts, responses, ["a", "b"], ["0", "1"], 0, device, own_masks=masks
    )
    logp, _ = token_logprobs(run.policy, batch.input_ids, batch.attention_mask, batch.prompt_width)
    logp.retain_grad()
    (logp * batch.response_mask).sum().backward()
    assert torch.all(logp.grad[batch.response_mask == 0] == 0)
    grads[device] = run.policy.model.embed_tokens.weight.grad.float().cpu()
    print(device, "masked-token grads zero; embed grad norm", grads[device].norm().item())
print("cpu vs cuda embed grad max abs diff", (grads["cpu"] - grads["cuda"]).abs().max().item())
assert torch.allclose(grads["cpu"], grads["cuda"], rtol=1e-3, atol=1e-5)
print("CUDA CHECKS PASSED")
