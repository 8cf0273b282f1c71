#!/usr/bin/env bash
# Create .venv (if needed) and install actorsys with its dev extras.
# torch is pinned to the CPU build first so that nothing pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev]'
