"""vLLM's OpenAI server on a listening socket it inherits, so that its port is never free.

``python -m actorsys_vllm_serve --listen-fd FD ARGS...`` runs what
``python -m vllm.entrypoints.openai.api_server ARGS...`` runs, except that where vLLM binds
its socket (``launcher.create_server_socket``, which its ``setup_server`` calls before the
engine starts) it gets the socket at descriptor FD instead: bound and listening on ``--host``
and ``--port`` by the process that started the server, before anyone could see the port. vLLM
accepts a Unix socket (``--uds``) too, but every client of ours speaks TCP; this is the one
place that knows vLLM's internals for it (vLLM 0.32: ``vllm.entrypoints.launchers``). Runs in
vLLM's venv; imports nothing from actorsys.
"""

from __future__ import annotations

import socket
import sys
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--listen-fd" or not argv[1].isdigit():
        print("usage: python -m actorsys_vllm_serve --listen-fd FD VLLM_ARGS...", file=sys.stderr)
        return 2
    inherited = socket.socket(fileno=int(argv[1]))
    if not inherited.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        print(f"actorsys_vllm_serve: descriptor {argv[1]} is not a listening socket",
              file=sys.stderr)
        return 2
    sys.argv = [sys.argv[0], *argv[2:]]

    from vllm.entrypoints.launchers import launcher
    from vllm.entrypoints.launchers.api_server import entry

    def serve_inherited(addr: tuple[str, int], **_: Any) -> socket.socket:
        port = inherited.getsockname()[1]
        if addr[1] != port:
            raise OSError(f"--port {addr[1]} is not the inherited socket's port {port}")
        return inherited

    launcher.create_server_socket = serve_inherited
    entry.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
