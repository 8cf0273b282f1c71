"""A trainer's rollouts against a real engine: completions sent from a thread, one after
another, the whole time a test or a bench runs beside them (shared mode's rollout engine)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx


class Rollouts:
    """Completions of ``body`` posted from a thread, one after another, until the block is
    left; ``done``: when each was answered (``time.perf_counter``), ``failures``: each one
    that failed, as its repr. ``key``: the engine's API key, if it takes one."""

    def __init__(self, url: str, key: str | None, body: dict[str, Any], *,
                 timeout: float = 60.0) -> None:
        self.url, self.key, self.body, self.timeout = url, key, body, timeout
        self.done: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Rollouts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2 * self.timeout)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        with httpx.Client(timeout=self.timeout, headers=headers) as client:
            while not self._stop.is_set():
                try:
                    response = client.post(f"{self.url}/v1/completions", json=self.body)
                    response.raise_for_status()
                    self.done.append(time.perf_counter())
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))

    def rate(self, start: float, end: float) -> float:
        """Requests answered a second, between the first and the last answered within
        [start, end]."""
        ended = [t for t in self.done if start <= t <= end]
        if len(ended) < 2:
            raise RuntimeError(f"fewer than two rollout requests ended in a {end - start:.1f} s "
                               "window: lengthen it")
        return (len(ended) - 1) / (ended[-1] - ended[0])
