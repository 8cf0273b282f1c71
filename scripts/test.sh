#!/usr/bin/env bash
# The test command: set up from scratch (our venv, and vLLM's CPU build in its own venv for the
# vLLM tier), then lint, type-check and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm.sh
.venv/bin/ruff check actorsys bridge tests examples bench
.venv/bin/mypy
.venv/bin/pytest -q "$@"
