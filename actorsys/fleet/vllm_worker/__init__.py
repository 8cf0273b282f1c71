"""vLLM's side of actorsys: code that runs inside vLLM's own processes (its venv), put on
their ``PYTHONPATH`` by the local fleet's vLLM spec. Imports nothing from actorsys."""

import os

WORKER_DIR = os.path.dirname(os.path.abspath(__file__))
EXTENSION_CLASS = "actorsys_vllm_worker.TiedWeightsReload"
