"""How to start an engine: :class:`EngineSpec`, and the specs of the embedded CPU engine
(:func:`embedded`) and of a vLLM server (:func:`vllm`).

A spec says nothing about where the engine runs: a :class:`~actorsys.fleet.local.LocalFleet`
starts it on loopback, a :class:`~actorsys.fleet.ray.RayFleet` inside a Ray actor.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from actorsys.fleet.clients.sglang import SGLangEngine
from actorsys.fleet.clients.vllm import RELOAD, TIED_RELOAD, VLLMEngine
from actorsys.fleet.embedded import API_KEY_ENV as ENGINE_API_KEY_ENV
from actorsys.fleet.fleet import Engine
from actorsys.fleet.vllm_launch import (
    VLLM_INHERITED_MODULE,
    VLLM_SERVER_MODULE,
    VLLMLaunch,
    vllm_command,
    vllm_launch,
)
from actorsys.fleet.vllm_worker.actorsys_api_key import KEY_ENV as VLLM_API_KEY_ENV

VLLM_PYTHON = ".venv-vllm/bin/python"


@dataclass(frozen=True)
class EngineSpec:
    """How to start one engine: its command for a given port, its environment, its client.

    ``api_key_env``: the environment variable the engine reads its API key from (None: it
    takes none). The fleet that starts it sets it to the fleet's key (the environment, unlike
    the command line, is hidden from other users) and builds the client as
    ``client(url, name, key)``; without one, as ``client(url, name)``.

    ``listen(argv, fd)``: ``argv`` changed to serve the listening socket it inherits at
    descriptor ``fd`` (bound by the fleet to 127.0.0.1 and ``argv``'s port) instead of binding
    one (None: the server binds its own port, and the fleet proves the listener is the
    server's before it sends anything there).
    """

    kind: str
    command: Callable[[int], list[str]]
    client: Callable[..., Engine]
    env: Mapping[str, str] = field(default_factory=dict)
    api_key_env: str | None = None
    listen: Callable[[list[str], int], list[str]] | None = None

    def environment(self, api_key: str | None) -> dict[str, str]:
        """The engine's whole environment: this process's, ``env``, and its key."""
        key = {self.api_key_env: api_key} if self.api_key_env and api_key else {}
        return {**os.environ, **self.env, **key}

    def make_client(self, url: str, name: str, api_key: str | None) -> Engine:
        if self.api_key_env is None:
            return self.client(url, name)
        return self.client(url, name, api_key)


def embedded(model_dir: str, *, extra_args: Sequence[str] = (), threads: int = 1) -> EngineSpec:
    """The embedded CPU engine serving ``model_dir`` (``extra_args`` go to its command line)."""
    model_dir = os.path.abspath(model_dir)
    return EngineSpec(
        kind="embedded",
        command=lambda port: [
            sys.executable, "-m", "actorsys", "engine", "--model", model_dir,
            "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads), *extra_args,
        ],
        client=lambda url, name, key: SGLangEngine(url, name=name, api_key=key),
        api_key_env=ENGINE_API_KEY_ENV,
        listen=lambda argv, fd: [*argv, "--listen-fd", str(fd)],
    )


def vllm(
    model_dir: str,
    *,
    python: str = VLLM_PYTHON,
    max_model_len: int = 512,
    kv_cache_bytes: int = 64 * 1024 * 1024,
    extra_args: Sequence[str] = (),
    tied_reload: bool = True,
    tool_call_parser: str | None = None,
) -> EngineSpec:
    """A vLLM OpenAI server on the CPU serving ``model_dir``, from the venv of ``python``
    (``scripts/setup_vllm.sh`` makes ``.venv-vllm``), with the weight-update endpoints on.

    The server gets actorsys' worker extension (``actorsys/fleet/vllm_worker``, put on its
    ``PYTHONPATH``) and its client reloads through it: vLLM 0.32's own ``reload_weights``
    leaves the CPU kernel of a tied ``lm_head`` built from the previous weights, so a model
    with tied embeddings would answer with the new body and the old head. The extension's
    ``reload_weights_tied`` reloads, then rebuilds that kernel (about 35 ms for a tiny model;
    a no-op for untied models). The checkpoint files need no change. ``tied_reload=False``
    starts the server as a user would, with vLLM's own reload (the weight probe then catches
    a tied model served wrong). ``tool_call_parser`` (``"hermes"``...): the chat endpoint reads
    tool calls in the answers into ``tool_calls``, as the CPU engine does for Hermes calls.
    """
    model_dir = os.path.abspath(model_dir)
    python = os.path.abspath(python)

    def launch(port: int) -> VLLMLaunch:
        command = vllm_command(python, model_dir, port, max_model_len=max_model_len,
                               kv_cache_bytes=kv_cache_bytes, tool_call_parser=tool_call_parser,
                               extra_args=extra_args)
        return vllm_launch(command, tied_reload=tied_reload)

    return EngineSpec(
        kind="vllm",
        command=lambda port: launch(port).argv,
        client=lambda url, name, key: VLLMEngine(
            url,
            name=name,
            api_key=key,
            served_model_dir=model_dir,
            reload_method=TIED_RELOAD if tied_reload else RELOAD,
        ),
        env=launch(0).env,
        api_key_env=VLLM_API_KEY_ENV,
        listen=serve_inherited,
    )


def serve_inherited(argv: list[str], fd: int) -> list[str]:
    """A vLLM server command (from :func:`vllm_command`) that serves the listening socket at
    descriptor ``fd`` through ``actorsys_vllm_serve`` (in ``vllm_worker``) instead of binding."""
    module = argv.index(VLLM_SERVER_MODULE)
    return [*argv[:module], VLLM_INHERITED_MODULE, "--listen-fd", str(fd), *argv[module + 1 :]]


ROUTER_KEY_ENV = "ACTORSYS_ROUTER_ADMIN_KEY"
ROUTER_MAIN = (
    "import os, sys; from sglang_router.launch_router import launch_router, parse_router_args; "
    "launch_router(parse_router_args([*sys.argv[1:], '--control-plane-api-keys', "
    f"'actorsys:fleet:admin:' + os.environ.pop({ROUTER_KEY_ENV!r})]))"
)
"""sglang-router's launcher, with its control plane (``/workers``: add or remove a worker)
locked by a random key that nobody holds: otherwise anyone who can connect could add a server
of theirs and receive the fleet's requests, key included. The key goes through the
environment, so no command line shows it. The data plane passes each request's
``Authorization`` header on to the engine, which checks the fleet's key."""


def router_command(port: int, metrics_port: int, worker_urls: list[str]) -> list[str]:
    """sglang-router on 127.0.0.1 ``port`` (its metrics on ``metrics_port``), round-robin over
    ``worker_urls``; its environment must hold a fresh key at ``ROUTER_KEY_ENV``."""
    return [
        sys.executable, "-c", ROUTER_MAIN,
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--policy", "round_robin", "--log-level", "warn",
        "--worker-urls", *worker_urls,
    ]
