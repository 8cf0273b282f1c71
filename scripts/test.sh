#!/usr/bin/env bash
# The test command: set up from scratch (our venv, and vLLM's CPU build in its own venv for the
# vLLM tier), then lint, type-check and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm.sh
.venv/bin/ruff check actorsys bridge tests examples bench
.venv/bin/mypy
# Three workers on two cores (much of a real-process test is waiting on a process or a socket):
# each test file runs whole on one of them, and the files that start Ray, or vLLM, run one at a
# time (tests/conftest.py: lane).
.venv/bin/pytest -q -n 3 --dist loadfile "$@"
