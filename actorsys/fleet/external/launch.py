"""The ``launch=`` argv of an :class:`~actorsys.fleet.external.ExternalServer`: checked, its
``--api-key`` kept out of sight, and completed into the command and environment that start the
server on a port of 127.0.0.1.

The key a user wrote into the argv (``--api-key KEY``) is taken out of it, so that neither the
argv the server keeps nor its repr shows it; it goes to the server in its environment
(``ACTORSYS_API_KEY`` for the embedded engine, ``VLLM_API_KEY`` for vLLM), which other users
cannot read. Only a server that is neither gets it back on its command line, with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from actorsys._errors import ConfigError
from actorsys.fleet._proc.serving import on_host
from actorsys.fleet.embedded import API_KEY_ENV as ENGINE_API_KEY_ENV
from actorsys.fleet.vllm_launch import vllm_launch
from actorsys.fleet.vllm_worker.actorsys_api_key import KEY_ENV as VLLM_API_KEY_ENV

log = logging.getLogger("actorsys.fleet")


def check_launch(launch: Sequence[str], owner: str) -> None:
    """Raise :class:`~actorsys.ConfigError` unless ``launch`` is an argv of strings with a
    ``{port}`` in it."""
    if isinstance(launch, str) or not launch or not all(isinstance(a, str) for a in launch):
        raise ConfigError(f"{owner}(launch)", f"expected an argv list of strings, got "
                          f"{launch!r}")
    if not any("{port}" in arg for arg in launch):
        raise ConfigError(f"{owner}(launch)", "the argv must contain '{port}' where "
                          "the server's port goes, e.g. '--port', '{port}'")


def argv_key(argv: Sequence[str]) -> str | None:
    """The value of ``--api-key`` in ``argv`` (the key a server launched with it requires)."""
    for index, arg in enumerate(argv):
        if arg.startswith("--api-key="):
            return arg.partition("=")[2] or None
        if arg == "--api-key" and index + 1 < len(argv):
            return argv[index + 1]
    return None


def without_key(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--api-key KEY`` / ``--api-key=KEY``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--api-key":
            skip = True
        elif not arg.startswith("--api-key="):
            kept.append(arg)
    return kept


def launch_command(
    launch: Sequence[str],
    port: int,
    *,
    api_key: str,
    key_in_argv: str | None,
    launches_vllm: bool,
    tied_reload: bool,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start the server of ``launch`` on 127.0.0.1 ``port``,
    requiring ``api_key``. ``key_in_argv``: the key the user wrote into ``launch``;
    ``launches_vllm``: complete it as a vLLM server (see
    :func:`~actorsys.fleet.vllm_launch.vllm_launch`, with ``tied_reload``)."""
    argv = on_host([arg.replace("{port}", str(port)) for arg in launch], "127.0.0.1")
    env = {**os.environ, ENGINE_API_KEY_ENV: api_key, VLLM_API_KEY_ENV: api_key}
    if key_in_argv is not None and not (launches_vllm or _is_engine(argv)):
        # Neither vLLM nor the embedded engine: a server that may read its key only from
        # its command line, where every local user can read it.
        argv = [*argv, "--api-key", key_in_argv]
        log.warning("the launched server gets its --api-key on its command line, which "
                    "every local user can read; vLLM and the embedded engine read it from "
                    "their environment instead")
    if launches_vllm:
        completed = vllm_launch(argv, tied_reload=tied_reload)
        argv = completed.argv
        env.update(completed.env)
    return argv, env


def _is_engine(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs the embedded engine (which reads ``ACTORSYS_API_KEY``)."""
    return any(a == "actorsys" and b == "engine" for a, b in zip(argv, argv[1:], strict=False))
