"""``python -m actorsys engine --model DIR --port P``: serve a model with the embedded engine.

Logs ``actorsys engine serving DIR at http://HOST:PORT`` on stderr once the model is loaded.
SIGTERM ends it within about a second (it holds nothing that needs saving).
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
from functools import partial
from typing import Any

import anyio
import torch
from hypercorn.asyncio import serve
from hypercorn.config import Config

from actorsys.fleet.embedded.model import ModelHost
from actorsys.fleet.embedded.server import EmbeddedEngine

log = logging.getLogger("actorsys.engine")


def add_engine_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "engine",
        help="serve a transformers model over the sglang API subset (the embedded CPU engine)",
        description=__doc__,
    )
    parser.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, required=True, help="port to bind (0: any free one)")
    parser.add_argument(
        "--max-batch", type=int, default=16, help="sequences generated together (default 16)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1; 0: torch's default)"
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
    if args.max_batch < 1:
        raise SystemExit("--max-batch: expected an integer >= 1")
    if args.threads < 0:
        raise SystemExit("--threads: expected an integer >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    anyio.run(
        partial(
            serve_engine,
            args.model,
            args.host,
            args.port,
            max_batch=args.max_batch,
            require_complete=args.require_complete,
            served_model_name=args.served_model_name,
            keep_old_weights=args.test_keep_old_weights,
            label_kept_weights=args.test_label_kept_weights,
        ),
        backend="asyncio",
    )
    return 0


async def serve_engine(
    model_dir: str,
    host: str,
    port: int,
    *,
    max_batch: int = 16,
    require_complete: bool = False,
    served_model_name: str | None = None,
    keep_old_weights: bool = False,
    label_kept_weights: bool = False,
) -> None:
    """Load the model, then serve it on asyncio until SIGTERM or SIGINT (after which requests
    in flight get a second to finish).

    The listening socket is bound before the model loads, so a port clash fails at once;
    connections made while the model loads are answered once it is in memory.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    url = f"http://{host}:{sock.getsockname()[1]}"
    model_host = await anyio.to_thread.run_sync(
        lambda: ModelHost(
            model_dir, keep_old_weights=keep_old_weights, label_kept_weights=label_kept_weights
        )
    )
    engine = EmbeddedEngine(
        model_host,
        max_batch=max_batch,
        require_complete=require_complete,
        served_model_name=served_model_name,
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


async def _stop_on_signal(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async for _ in received:
            stop.set()
            return
