"""The render worker: a process that renders chat templates to text and nothing else, run as a
script (``python worker.py FD``, so it imports no actorsys module) by
:mod:`actorsys.fleet._render.pool`, which talks to it over the socket ``FD``.

A chat template is code from the snapshot's files (or a request), and Jinja's sandbox bounds
``range`` only: nested loops, ``'x' * 10**9`` and recursive macros run as long, and take as much
memory, as they like. Here they can: the worker is the only thing they stall, it is killed
when its caller's deadline passes, and its own limits stop it even with no caller left:

- its address space is capped (``RLIMIT_AS``, :data:`MEMORY_BYTES` by the pool), so an
  enormous string is a ``MemoryError`` it reports, never memory the machine lacks;
- each render may spend only so many CPU seconds (``RLIMIT_CPU``), so a render whose caller
  died (nobody left to kill it) ends anyway, by SIGXCPU;
- a rendered text past the pool's character cap is reported, never sent.

The text is transformers' own: ``render_jinja_template`` after ``_normalize_chat_messages``, as
``apply_chat_template`` renders it, with the same template variables. The worker imports only
that module (and jinja2, numpy), not torch nor the tokenizers.

Requests are pickles from the parent (trusted); replies are JSON (the worker runs untrusted
templates, so the parent never unpickles what it sends): ``{"text": ...}`` or
``{"error": kind, "message": ...}``. The first reply, ``{"ready": pid}``, says the imports are
done. At EOF on the socket (the parent closed it or died) the worker exits.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any


def _limit_memory(limit: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):  # a system without the limit: the deadline still holds
        pass


def _limit_cpu(seconds: int) -> None:
    """Let this render spend ``seconds`` more CPU seconds; past them the kernel sends
    SIGXCPU, whose default action ends the process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):  # a system without the limit: the caller's kill still holds
        pass


def _render(request: dict[str, Any]) -> str:
    from transformers.utils.chat_template_utils import (
        _normalize_chat_messages,
        render_jinja_template,
    )

    conversation = _normalize_chat_messages(request["messages"])
    # (texts, generation indices), one of each per conversation (its annotation says str)
    rendered: Any = render_jinja_template(
        conversations=[conversation],
        tools=request["tools"],
        documents=None,
        chat_template=request["template"],
        return_assistant_tokens_mask=False,
        continue_final_message=False,
        add_generation_prompt=request["add_generation_prompt"],
        **request["variables"],
    )
    text = rendered[0][0]
    if not isinstance(text, str):
        raise TypeError(f"the template rendered {type(text).__name__}, not text")
    return text


_MEMORY_BYTES = 0
"""This worker's address-space cap, set at its start."""


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    try:
        _limit_cpu(request["cpu_seconds"])
        text = _render(request)
    except MemoryError:
        return {"error": "memory", "message": "it needs more memory than a render may take "
                f"({_MEMORY_BYTES // 2**20} MiB of address space)"}
    except RecursionError:
        return {"error": "recursion", "message": "it recursed or nested too deeply"}
    except Exception as exc:  # every error of an untrusted template is its caller's answer
        return {"error": type(exc).__module__.split(".")[0] + "." + type(exc).__name__,
                "message": str(exc)[:2000]}
    limit = request["max_chars"]
    if len(text) > limit:
        return {"error": "size", "message": f"it rendered {len(text)} characters, past the "
                f"limit of {limit}"}
    return {"text": text}


def main(fd: int, memory_bytes: int) -> None:
    """Render the requests that come on ``fd`` until it closes, within ``memory_bytes`` of
    address space."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's
    connection = Connection(socket.socket(fileno=fd).detach())
    import transformers.utils.chat_template_utils  # noqa: F401 - the import is the warm-up

    global _MEMORY_BYTES
    _MEMORY_BYTES = memory_bytes
    _limit_memory(memory_bytes)
    connection.send_bytes(json.dumps({"ready": os.getpid()}).encode())
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return
        try:
            reply = json.dumps({**_answer(request), "id": request["id"]}, ensure_ascii=False)
        except MemoryError:
            reply = json.dumps({"error": "memory", "message": "its text did not fit in memory",
                                "id": request["id"]})
        connection.send_bytes(reply.encode("utf-8", "surrogatepass"))


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # this folder's modules are not top-level modules
    main(int(sys.argv[1]), int(sys.argv[2]))
