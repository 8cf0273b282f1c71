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
# the modules that start Ray, or vLLM, run one test at a time, first, in the xdist_group of
# that name; a module with an expensive module-scoped fixture runs whole on one worker; every
# other test is scheduled on its own (tests/conftest.py: LANES).
.venv/bin/pytest -q -n 3 --dist loadgroup --no-loadscope-reorder "$@"
