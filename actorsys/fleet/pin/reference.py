"""The weight probe's reference worker: the snapshot's own answer, computed in a process of
its own.

Computing the reference means building the snapshot's model with transformers and running
its forward passes. In the trainer's process that would map the snapshot's weights there (16 GB
for an 8B model), run the forward on the trainer's CPUs, take the trainer down with it if it
ran out of memory, and swap process-wide state while it loads (``from_pretrained`` replaces
``PreTrainedModel.tie_weights`` and torch's default dtype for the duration of a load, so a
trainer loading a model in another thread at that moment could keep untied embeddings for
good; see :mod:`actorsys.fleet.model_load`). So the reference is computed here instead: a
worker process (:func:`main`, in a fresh interpreter), started at the first reference
asked of it or ahead of it (:meth:`ReferenceWorker.warm`: a supervisor with a probed fleet
starts it when it opens, so its imports are done before the first pin), ``nice``\\ d, fed
one request at a time over a pipe. It loads each snapshot
through transformers' normal path (every weight conversion included: tied embeddings, the
experts transformers 5 fuses at load), which maps the safetensors files and computes on the
mapped pages where the dtype needs no conversion, and drops the model once the answer is out;
the answer it sends back is a few kilobytes (:class:`~actorsys.fleet.pin.probe.Reference`).

A worker that dies (killed, out of memory) costs the request it was computing: the call
raises :class:`ReferenceFailedError`, and the next request starts a fresh worker. Cancelling
a call kills the worker (the next one starts afresh), so a pin deadline or a close never
waits on a forward pass; :meth:`ReferenceWorker.aclose` kills it too. A worker whose owner
dies reads the end of its pipe and exits after the request at hand.
"""

from __future__ import annotations

import atexit
import gc
import os
import pickle
import struct
import subprocess
import sys
import threading
import weakref
from typing import IO, Any

import trio

from actorsys.fleet.pin.probe import Reference, ReferenceFailedError, compute_reference
from actorsys.runtime import ThreadTracker, run_blocking

NICENESS = 10
"""How much lower the worker's CPU priority is than its owner's."""

_HEADER = struct.Struct("!Q")
_WORKERS: weakref.WeakSet[ReferenceWorker] = weakref.WeakSet()
_PACKAGE_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir))


def _send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the pipe."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)  # noqa: S301 - our own worker, over our own pipe


class ReferenceWorker:
    """One reference worker process, started at the first :meth:`compute`, shared by every
    fleet of its owner (one request at a time). Usable from any trio run and thread. The
    process is killed by :meth:`aclose`, when a computation is cancelled, when this object is
    collected, and at interpreter exit."""

    def __init__(self) -> None:
        self._box: list[subprocess.Popen[bytes] | None] = [None]
        self._lock = threading.Lock()
        self._guard = threading.Lock()
        self._limiter = trio.CapacityLimiter(1)
        self.tracker = ThreadTracker()
        self.started = 0
        """How many worker processes this object has started (a fresh one after each death)."""
        _WORKERS.add(self)
        weakref.finalize(self, _kill_boxed, self._box)

    @property
    def pid(self) -> int | None:
        """The live worker's process id, or None."""
        process = self._box[0]
        return process.pid if process is not None and process.poll() is None else None

    async def compute(self, path: str, prompts: list[list[int]]) -> Reference:
        """The snapshot's answer to ``prompts``, computed by the worker. Raises
        :class:`ReferenceFailedError` where the worker died or the computation failed.
        Cancelling kills the worker (abandoning the thread that waits on it)."""
        try:
            return await run_blocking(
                lambda: self._request(path, prompts),
                abandon_on_cancel=True,
                limiter=self._limiter,
                description=f"weight probe reference of {path}",
                tracker=self.tracker,
            )
        except trio.Cancelled:
            self.kill()
            raise

    def kill(self) -> None:
        """Kill the worker, if one runs (SIGKILL; the thread reading its pipe reaps it, or
        the next start does). Never blocks; idempotent."""
        with self._guard:
            process, self._box[0] = self._box[0], None
        if process is not None and process.poll() is None:
            process.kill()

    async def aclose(self) -> None:
        """Kill the worker and reap it, in a worker thread."""
        with self._guard:
            process, self._box[0] = self._box[0], None
        if process is None:
            await trio.lowlevel.checkpoint()  # nothing to reap, and still a checkpoint
            return
        if process.poll() is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await run_blocking(
                process.wait,
                abandon_on_cancel=True,
                limiter=trio.CapacityLimiter(1),
                description="reaping the reference worker",
                tracker=self.tracker,
            )

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])]
        )
        process = subprocess.Popen(
            [sys.executable, "-c", "from actorsys.fleet.pin.reference import main; main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        self.started += 1
        return process

    async def warm(self) -> None:
        """Start the worker now, if none runs, so that its imports (torch, transformers: a few
        seconds of CPU, at its lower priority) are done before the first reference is asked.
        Returns once the process is started, not once it is ready; a request that comes
        meanwhile waits in its pipe. Cancellable while it waits for the worker's lock; the
        start itself (a fork and exec, milliseconds) is never abandoned, so a close that
        cancels it finds the process in its box and kills it, never leaving one behind."""
        await run_blocking(
            self._live,
            abandon_on_cancel=False,
            limiter=self._limiter,
            description="starting the reference worker",
            tracker=self.tracker,
        )

    def _live(self) -> subprocess.Popen[bytes]:
        """The running worker, started if there is none."""
        with self._guard:
            process = self._box[0]
            if process is None or process.poll() is not None:
                process = self._box[0] = self._start()
            return process

    def _request(self, path: str, prompts: list[list[int]]) -> Reference:
        with self._lock:
            process = self._live()
            assert process.stdin is not None and process.stdout is not None
            try:
                _send(process.stdin, (path, prompts))
                reply = _receive(process.stdout)
            except (BrokenPipeError, OSError, ValueError, pickle.UnpicklingError):
                reply = None
            if reply is None:
                process.kill()
                code = process.wait()
                with self._guard:
                    if self._box[0] is process:
                        self._box[0] = None
                raise ReferenceFailedError(
                    f"the reference worker exited (status {code}) while computing the "
                    f"answer of {path}"
                )
        kind, payload = reply
        if kind == "ok":
            assert isinstance(payload, Reference)
            return payload
        raise ReferenceFailedError(f"computing the answer of {path} failed: {payload}")


def _kill_boxed(box: list[subprocess.Popen[bytes] | None]) -> None:
    """A worker whose owner was collected goes with it."""
    process, box[0] = box[0], None
    if process is not None and process.poll() is None:
        process.kill()


@atexit.register
def _kill_all() -> None:
    for worker in list(_WORKERS):
        worker.kill()


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    while (request := _receive(requests)) is not None:
        path, prompts = request
        try:
            reply: tuple[str, Any] = ("ok", compute_reference(path, prompts))
        except Exception as exc:
            reply = ("failed", f"{type(exc).__name__}: {exc}")
        _send(replies, reply)
        gc.collect()


def main() -> None:
    """The worker: answers requests on stdin until its end. Its stdout is the reply pipe
    only (whatever a library prints goes to stderr)."""
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _import_ahead()
    _serve(sys.stdin.buffer, replies)


def _import_ahead() -> None:
    """Import what every reference needs before the first request is read: a worker started
    ahead of its first request (:meth:`ReferenceWorker.warm`) is then ready when it comes.
    transformers imports its loading path lazily, at the first ``from_pretrained``:
    ``modeling_utils`` and ``generation`` (which pull in ``torch.distributed``,
    ``torch._dynamo``, sympy, scipy, accelerate: some 1,600 modules, about 2 s of CPU and
    110 MB of the worker's memory) are imported here, so the first reference costs what the
    next ones do (the model's own module and its load, about 0.2 s of CPU)."""
    import torch  # noqa: F401
    import transformers.generation  # noqa: F401
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401


if __name__ == "__main__":
    main()
