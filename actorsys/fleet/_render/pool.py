"""Chat templates rendered where they can be stopped: the render workers of this process.

A template is untrusted code (a snapshot's tokenizer files), and Jinja's sandbox bounds
``range`` only. Rendered in a thread, a template that loops for ever spins there for good,
holding the GIL against every other thread of the process (an engine's requests and weight
loads, a trainer's steps), and one that builds a huge string takes the process's memory. So
every render runs in a worker process (:mod:`actorsys.fleet._render.worker`), within
:data:`RENDER_TIMEOUT` seconds, :data:`MEMORY_BYTES` of address space and
:data:`MAX_RENDERED_CHARS` characters of text; one that overruns its deadline gets its worker
killed (SIGKILL) and a fresh one started in the background.

The workers are the process's: one is started ahead (:func:`warm`, when an engine starts or a
chat dataset is first prepared) and reused by every render; a render that finds every worker
busy starts another, up to :data:`RENDER_WORKERS`, which stay for the renders after. A worker
imports transformers' template renderer only (about a second), never torch or a tokenizer.

Every call here blocks (on a worker's socket, or its start) and is meant for a worker thread;
none can be cancelled, but each is bounded: a render by its deadline, a start by
:data:`START_TIMEOUT`. A forked child gets workers of its own.
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

RENDER_TIMEOUT = 10.0
"""Seconds a render may take, from the moment a worker has it."""
MAX_RENDERED_CHARS = 4 * 2**20
"""The longest text a render may produce."""
MAX_TEMPLATE_CHARS = 2**20
"""The longest template rendered at all (real ones are a few KB)."""
MEMORY_BYTES = 2**30
"""The address space a worker may use (its imports take about 200 MB of it)."""
RENDER_WORKERS = 4
"""At most this many renders of this process run at once."""
START_TIMEOUT = 120.0
"""Seconds a worker may take to start (its imports), on a busy machine."""
REPLY_BYTES = 6 * MAX_RENDERED_CHARS + 2**16
"""The longest reply read from a worker: the text, JSON-escaped."""

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


class _RenderOverrun(ValueError):
    """A render ran past its deadline (its worker was killed)."""


@dataclass(frozen=True)
class RenderJob:
    """What a worker renders: ``apply_chat_template``'s inputs, its template resolved
    (``template``) and its template variables merged (``variables``: the tokenizer's special
    tokens, then the caller's keyword arguments)."""

    template: str
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None
    add_generation_prompt: bool
    variables: Mapping[str, Any]


class _Worker:
    """One worker process and its end of the socket."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, WORKER, str(theirs.fileno()), str(MEMORY_BYTES)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=_worker_environment(),
                start_new_session=True,  # a Ctrl-C at the terminal is the parent's to handle
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.connection = Connection(ours.detach())
        try:
            reply = self._reply(START_TIMEOUT)
        except BaseException:
            self.kill()
            raise
        if "ready" not in reply:
            self.kill()
            raise RuntimeError(f"the render worker did not start: {reply}")

    def render(self, request: bytes, timeout: float) -> dict[str, Any]:
        """The worker's reply to ``request`` (a pickle). Raises :class:`_RenderOverrun` past
        ``timeout``, and ``OSError``/``EOFError`` where the worker died (the worker is then
        unusable)."""
        self.connection.send_bytes(request)
        return self._reply(timeout)

    def _reply(self, timeout: float) -> dict[str, Any]:
        if not self.connection.poll(timeout):
            raise _RenderOverrun(f"it ran past its deadline of {timeout:g} s")
        raw = self.connection.recv_bytes(REPLY_BYTES)
        reply: dict[str, Any] = json.loads(raw.decode("utf-8", "surrogatepass"))
        return reply

    def died(self) -> str:
        """How the worker ended (after a failed call)."""
        code = self.process.poll()
        if code is None:
            return "it stopped answering"
        if code < 0:
            return f"its worker was killed by signal {-code} (out of time or memory)"
        return f"its worker exited with status {code}"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.connection.close()


def _worker_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["TRANSFORMERS_VERBOSITY"] = "error"
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # numpy's thread pools would only take address space
    return env


class RenderWorkers:
    """The render workers of one process: idle ones are reused, busy ones are never shared.
    Thread-safe."""

    def __init__(self, size: int = RENDER_WORKERS) -> None:
        self._size = size
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._alive = 0  # idle, busy and starting
        self._starting = 0  # started ahead, in the background
        self._ids = itertools.count()
        self._closed = False

    def warm(self) -> None:
        """Start a worker in a background thread unless one is idle or starting. Returns at
        once."""
        with self._lock:
            if self._idle or self._starting or self._closed:
                return
            self._alive += 1
            self._starting += 1
        threading.Thread(target=self._start_idle, name="actorsys-render-start", daemon=True).start()

    def render(self, job: RenderJob, *, timeout: float = RENDER_TIMEOUT) -> str:
        """``job`` rendered to text by a worker within ``timeout`` seconds. Raises
        ``ValueError`` naming the problem: the template's own error, a recursion, memory or
        text past the limits, a worker that died, or the deadline (:class:`_RenderOverrun`;
        the worker is killed). Blocking: on a free worker (or a new one's start), then on the
        render."""
        if len(job.template) > MAX_TEMPLATE_CHARS:
            raise ValueError(f"the template is {len(job.template)} characters long, past the "
                             f"limit of {MAX_TEMPLATE_CHARS}")
        request = {
            "id": next(self._ids),
            "template": job.template,
            "messages": [dict(m) for m in job.messages],
            "tools": [dict(t) for t in job.tools] if job.tools else None,
            "add_generation_prompt": job.add_generation_prompt,
            "variables": dict(job.variables),
            "max_chars": MAX_RENDERED_CHARS,
            "cpu_seconds": math.ceil(timeout) * 2 + 1,
        }
        try:
            payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        except RecursionError:
            raise ValueError("the conversation or its tools nest too deeply to render") from None
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ValueError(f"the conversation holds a value that cannot be rendered: {exc}") from None
        worker = self._take()
        try:
            reply = worker.render(payload, timeout)
        except _RenderOverrun:
            self._discard(worker)
            raise
        except (OSError, EOFError, ValueError):
            reason = worker.died()
            self._discard(worker)
            raise ValueError(f"the template could not be rendered: {reason}") from None
        except BaseException:
            self._discard(worker)
            raise
        self._give_back(worker)
        if "text" in reply and isinstance(reply["text"], str):
            return reply["text"]
        kind, message = reply.get("error"), reply.get("message")
        if kind == "size":
            raise ValueError(f"the rendered text is too long: {message}")
        if kind in ("memory", "recursion"):
            raise ValueError(f"the template cannot be rendered: {message}")
        raise ValueError(f"{kind}: {message}")

    def close(self) -> None:
        """Kill every idle worker; a busy one is killed when its render returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
            self._lock.notify_all()
        for worker in idle:
            worker.kill()

    def _take(self) -> _Worker:
        with self._lock:
            # A worker starting in the background is waited for rather than started twice.
            while not self._idle and (self._starting or self._alive >= self._size):
                self._lock.wait()
            if self._idle:
                return self._idle.pop()
            self._alive += 1
        try:
            return _Worker()
        except BaseException as exc:
            with self._lock:
                self._alive -= 1
                self._lock.notify()
            if isinstance(exc, OSError | RuntimeError | EOFError | ValueError):
                raise ValueError(f"the template could not be rendered: no render worker "
                                 f"started ({exc})") from None
            raise

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                self._lock.notify()
                return
            self._alive -= 1
        worker.kill()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._alive -= 1
            self._lock.notify()
        self.warm()

    def _start_idle(self) -> None:
        try:
            worker: _Worker | None = _Worker()
        except Exception:  # a render that needs one starts its own and says why it cannot
            worker = None
        with self._lock:
            self._starting -= 1
            if worker is not None and not self._closed:
                self._idle.append(worker)
                worker = None
            else:
                self._alive -= 1
            self._lock.notify_all()
        if worker is not None:
            worker.kill()


_WORKERS: tuple[int, RenderWorkers] | None = None
_WORKERS_LOCK = threading.Lock()


def render_workers() -> RenderWorkers:
    """This process's render workers (a forked child makes its own)."""
    global _WORKERS
    with _WORKERS_LOCK:
        if _WORKERS is None or _WORKERS[0] != os.getpid():
            _WORKERS = (os.getpid(), RenderWorkers())
        return _WORKERS[1]


@atexit.register
def _close_workers() -> None:
    workers = _WORKERS
    if workers is not None and workers[0] == os.getpid():
        workers[1].close()
