"""``python -m actorsys engine --model DIR --port P``: serve a model with the embedded engine.

Logs ``actorsys engine serving DIR at http://HOST:PORT`` on stderr once the model is loaded.
SIGTERM ends it within about a second (it holds nothing that needs saving).

With ``--api-key KEY`` (or the environment's ``ACTORSYS_API_KEY``, which other users cannot
read the way they can read a command line) every route but ``/health`` needs
``Authorization: Bearer KEY``. It listens on 127.0.0.1 unless ``--host`` says otherwise, and
another address needs a key. ``--listen-fd FD`` serves a listening socket inherited from the
process that started the engine (bound to ``--host``/``--port`` there, so the port is never
free for another user to take) instead of binding one. ``--model`` must be a local checkpoint
directory: nothing is fetched from a hub.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import sys
from functools import partial
from typing import Any

import anyio
import torch
from hypercorn.asyncio import serve
from hypercorn.config import Config

from actorsys._flags import EXIT_USAGE, int_at_least, seconds_or_zero
from actorsys.fleet._proc.port import held_listener, inherited_listener
from actorsys.fleet.checkpoint import CheckpointMismatchError
from actorsys.fleet.embedded import API_KEY_ENV
from actorsys.fleet.embedded.batching import PRIORITY_GRACE
from actorsys.fleet.embedded.model import ModelHost
from actorsys.fleet.embedded.server import MAX_BODY_BYTES, EmbeddedEngine

log = logging.getLogger("actorsys.engine")


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535] (0: any free one), "
                                         f"got {text!r}")
    return value


def model_dir(text: str) -> str:
    if not os.path.isfile(os.path.join(text, "config.json")):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a checkpoint directory (no config.json); pass a local Hugging Face "
            "checkpoint directory (nothing is fetched from a hub)"
        )
    return text


def add_engine_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "engine",
        help="serve a transformers model over the sglang API subset (the embedded CPU engine)",
        description=__doc__,
    )
    parser.add_argument("--model", required=True, type=model_dir,
                        help="a local Hugging Face checkpoint directory")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; another one needs a key)")
    parser.add_argument("--port", type=port_number, required=True,
                        help="port to bind (0: any free one)")
    parser.add_argument("--listen-fd", type=int_at_least(0), default=None, metavar="FD",
                        help="serve the listening socket inherited at descriptor FD (bound to "
                             "--host:--port by whoever started the engine, so the port is "
                             "never free for another process to take) instead of binding")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on every route but /health "
                             f"(default: ${API_KEY_ENV}; prefer it, a command line is visible "
                             "to every user)")
    parser.add_argument(
        "--max-batch", type=int_at_least(1), default=16,
        help="sequences generated together (default 16)",
    )
    parser.add_argument(
        "--priority-grace", type=seconds_or_zero, default=PRIORITY_GRACE, metavar="SECONDS",
        help="how long a batch of only larger-priority requests (an evaluation's) waits for "
             "the smaller-priority work answered just before (a rollout loop's next request) "
             f"to be batched with it (default {PRIORITY_GRACE:g}; 0: never)",
    )
    parser.add_argument(
        "--max-body-bytes", type=int_at_least(1), default=MAX_BODY_BYTES,
        help=f"largest request body accepted, larger ones get 413 (default {MAX_BODY_BYTES})",
    )
    parser.add_argument(
        "--threads", type=int_at_least(0), default=1,
        help="torch CPU threads (default 1; 0: torch's default)",
    )
    parser.add_argument(
        "--require-complete",
        action="store_true",
        help="refuse to load checkpoints without a .complete marker",
    )
    parser.add_argument("--served-model-name", default=None, help="model id in /v1/models")
    parser.add_argument(
        "--test-keep-old-weights",
        action="store_true",
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--test-label-kept-weights",
        action="store_true",
        help=argparse.SUPPRESS,
    )
    parser.set_defaults(run=run_engine)


def run_engine(args: argparse.Namespace) -> int:
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if args.api_key == "":
        return _usage("argument --api-key: expected a non-empty key")
    if api_key is None and not _is_loopback(args.host):
        return _usage(f"argument --host: {args.host} is reachable from other hosts; pass "
                      f"--api-key (or set {API_KEY_ENV}), or bind 127.0.0.1")
    if args.listen_fd is not None:
        try:
            sock = inherited_listener(args.listen_fd)
        except OSError as exc:
            return _usage(f"argument --listen-fd: {exc.strerror or exc}")
        bound = sock.getsockname()[:2]
        if bound[1] != args.port or not _same_host(bound[0], args.host):
            sock.close()
            return _usage(f"argument --listen-fd: descriptor {args.listen_fd} listens on "
                          f"{bound[0]}:{bound[1]}, not on {args.host}:{args.port}")
    else:
        try:
            sock = listening_socket(args.host, args.port)
        except OSError as exc:
            return _usage(f"argument --port: cannot listen on {args.host}:{args.port}: "
                          f"{exc.strerror or exc}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        anyio.run(partial(
            serve_engine,
            args.model,
            sock,
            max_batch=args.max_batch,
            priority_grace=args.priority_grace,
            require_complete=args.require_complete,
            served_model_name=args.served_model_name,
            api_key=api_key,
            max_body_bytes=args.max_body_bytes,
            keep_old_weights=args.test_keep_old_weights,
            label_kept_weights=args.test_label_kept_weights,
        ), backend="asyncio")
    except CheckpointMismatchError as exc:  # the model directory cannot be served: one line
        sys.stderr.write(f"actorsys engine: --model {exc}\n")
        return 1
    return 0


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening; raises ``OSError`` (the port is
    taken, the address is not this machine's)."""
    return held_listener(host, port, reuse_address=True)


async def serve_engine(
    model_dir: str,
    sock: socket.socket,
    *,
    max_batch: int = 16,
    priority_grace: float = PRIORITY_GRACE,
    require_complete: bool = False,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    keep_old_weights: bool = False,
    label_kept_weights: bool = False,
) -> None:
    """Load the model, then serve it on asyncio until SIGTERM or SIGINT (after which requests
    in flight get a second to finish).

    ``sock`` listens already (see :func:`listening_socket`): it is bound before the model
    loads, so a port clash fails at once; connections made while the model loads are
    answered once it is in memory.
    """
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    model_host = await anyio.to_thread.run_sync(
        lambda: ModelHost(
            model_dir, keep_old_weights=keep_old_weights, label_kept_weights=label_kept_weights
        )
    )
    # The first encode settles the tokenizer's truncation and padding state (a write); the
    # ones after it only read, so requests may be tokenized in several threads at once.
    await anyio.to_thread.run_sync(model_host.encode, "warm-up")
    engine = EmbeddedEngine(
        model_host,
        max_batch=max_batch,
        priority_grace=priority_grace,
        require_complete=require_complete,
        served_model_name=served_model_name,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
    )
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 75.0
    log.info("actorsys engine serving %s at %s", model_dir, url)
    app: Any = engine.app()  # an ASGI app; hypercorn's annotation is narrower than starlette's
    stop = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(engine.run)
        tasks.start_soon(_stop_on_signal, stop)
        await serve(app, config, shutdown_trigger=stop.wait)
        engine.close()
    log.info("actorsys engine at %s stopped", url)


def _same_host(bound: str, host: str) -> bool:
    if host == "localhost":
        return _is_loopback(bound)
    try:
        return ipaddress.ip_address(bound) == ipaddress.ip_address(host)
    except ValueError:
        return False


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _usage(message: str) -> int:
    sys.stderr.write(f"actorsys engine: {message}\n")
    return EXIT_USAGE


async def _stop_on_signal(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async for _ in received:
            stop.set()
            return
