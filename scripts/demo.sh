#!/usr/bin/env bash
# The main job: set up, then run the demo (a tiny model learns addition while actorsys
# evaluates it live on two local CPU engines). Arguments go to `actorsys demo`, e.g. --out DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m actorsys demo "$@"
