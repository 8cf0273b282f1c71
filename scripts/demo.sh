#!/usr/bin/env bash
# The main job: set up, then run the minimal example (three eval points through EvalSupervisor).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python examples/minimal.py "$@"
