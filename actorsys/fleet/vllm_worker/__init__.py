"""vLLM's side of actorsys: code that runs inside vLLM's own processes (its venv), put on
their ``PYTHONPATH`` by the local fleet's vLLM spec. Imports nothing from actorsys."""

import os

WORKER_DIR = os.path.dirname(os.path.abspath(__file__))
EXTENSION_CLASS = "actorsys_vllm_worker.TiedWeightsReload"
API_KEY_MIDDLEWARE = "actorsys_api_key.ApiKeyMiddleware"
"""vLLM's ``--middleware`` that guards every route but ``/health`` with ``VLLM_API_KEY``."""
WEIGHT_VERSION_MIDDLEWARE = "actorsys_weight_version.WeightVersionMiddleware"
"""vLLM's ``--middleware`` that refuses a request naming another weight version than the one
served (the request gate's ``x-actorsys-weight-version``)."""
