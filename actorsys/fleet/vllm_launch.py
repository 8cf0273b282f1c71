"""How actorsys starts a vLLM OpenAI server: the one place its command line is completed.

Every vLLM server actorsys starts (a local fleet's, a Ray engine's, the one ``ServerEvalFn``
launches) runs with ``VLLM_SERVER_DEV_MODE=1`` (the weight-update endpoints), with
actorsys' key middleware (``--middleware``: vLLM's own ``--api-key`` guards only ``/v1/...``,
the middleware guards the dev-mode routes that swap and label the weights too; it reads the
key from ``VLLM_API_KEY``, which whoever starts the server sets) and, unless told otherwise,
with actorsys' worker extension (``--worker-extension-cls``), whose reload also rebuilds what
vLLM's own leaves stale on the CPU (a tied ``lm_head``'s packed kernel). Both live in
``actorsys/fleet/vllm_worker``, put first on the server's ``PYTHONPATH``. Options every such
server needs go here, so that each way of starting one gets them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from actorsys.fleet.vllm_worker import (
    API_KEY_MIDDLEWARE,
    EXTENSION_CLASS,
    WEIGHT_VERSION_MIDDLEWARE,
    WORKER_DIR,
)

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_INHERITED_MODULE = "actorsys_vllm_serve"
"""The same server on a listening socket it inherits (``vllm_worker/actorsys_vllm_serve.py``)."""
EXTENSION_FLAG = "--worker-extension-cls"
MIDDLEWARE_FLAG = "--middleware"


@dataclass(frozen=True)
class VLLMLaunch:
    """A vLLM server's command line and the environment variables to add to its own."""

    argv: list[str]
    env: dict[str, str]


def vllm_launch(
    argv: Sequence[str], *, tied_reload: bool = True, environ: Mapping[str, str] | None = None
) -> VLLMLaunch:
    """``argv`` (a vLLM OpenAI server's command) completed as actorsys runs it.

    The key middleware and the weight-version middleware (which refuses a request of the
    request gate's that names another version than the one served) are always added; with
    ``tied_reload`` the worker extension too, unless
    ``argv`` names a ``--worker-extension-cls`` of its own. Their directory goes first on the
    ``PYTHONPATH`` taken from ``environ`` (default: this process's environment). The server
    refuses to start without ``VLLM_API_KEY`` in its environment. Pure: reads no file.
    """
    command = list(argv)
    if tied_reload and EXTENSION_FLAG not in command:
        command += [EXTENSION_FLAG, EXTENSION_CLASS]
    # vLLM wraps its app in each --middleware in turn, the last outermost: the key is
    # checked first, so only a client with it learns the served version from a refusal.
    command += [MIDDLEWARE_FLAG, WEIGHT_VERSION_MIDDLEWARE, MIDDLEWARE_FLAG, API_KEY_MIDDLEWARE]
    inherited = (os.environ if environ is None else environ).get("PYTHONPATH")
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (WORKER_DIR, inherited) if p),
    }
    return VLLMLaunch(command, env)


def vllm_command(
    python: str,
    model_dir: str,
    port: int,
    *,
    max_model_len: int = 512,
    kv_cache_bytes: int = 64 * 1024 * 1024,
    tool_call_parser: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command of a vLLM OpenAI server on the CPU serving ``model_dir`` on
    ``127.0.0.1:port``, from the venv of ``python`` (before :func:`vllm_launch`).

    vLLM serves ``/v1/chat/completions`` with the snapshot's chat template; with
    ``tool_call_parser`` (``"hermes"`` for Qwen2.5/3 and most tool-trained models) it also
    reads the tool calls in the answers into ``tool_calls`` (``--enable-auto-tool-choice``)."""
    tools = ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser] if tool_call_parser else []
    return [
        python, "-m", VLLM_SERVER_MODULE,
        "--model", model_dir, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(max_model_len), "--enforce-eager",
        "--kv-cache-memory-bytes", str(kv_cache_bytes), *tools, *extra_args,
    ]
