"""A :class:`~actorsys.fleet.local.LocalFleet` held open by a thread of its own, for a plain
(non-trio) program such as the demo's trainer.

The engines' processes die with the thread that started them (``PR_SET_PDEATHSIG``), so the
thread lives until its ``with`` block is left. The engine clients open a connection per call,
so the bridge's trio thread may use the fleets made of them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType

import trio

from actorsys.fleet.fleet import Fleet
from actorsys.fleet.local import EngineSpec, LocalFleet
from actorsys.watch.fleets import split


class FleetThread:
    """``with FleetThread(specs, fleets=k, log_dir=...) as held:`` starts one engine per spec
    and waits until all are healthy (or raises what the start raised); ``held.fleets`` splits
    the engines round-robin into ``k`` fleets that evaluate in parallel. Leaving the block
    stops every engine (SIGTERM, then SIGKILL after the launcher's grace) and blocks until
    they are gone."""

    def __init__(
        self,
        specs: Sequence[EngineSpec],
        *,
        fleets: int = 1,
        log_dir: str | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        if not 1 <= fleets <= len(specs):
            raise ValueError(f"fleets: expected 1 to {len(specs)} (one engine at least each), got {fleets}")
        self.specs = list(specs)
        self.fleet_count = fleets
        self.log_dir = log_dir
        self.startup_timeout = startup_timeout
        self.fleets: list[Fleet] = []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="actorsys-fleet", daemon=True)

    def __enter__(self) -> FleetThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            trio.run(self._hold)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _hold(self) -> None:
        async with LocalFleet.open(
            self.specs, log_dir=self.log_dir, startup_timeout=self.startup_timeout
        ) as local:
            engines = local.fleet.engines
            self.fleets = [Fleet(group) for group in split(engines, self.fleet_count)]  # type: ignore[arg-type]
            self._ready.set()
            await trio.to_thread.run_sync(self._stop.wait, abandon_on_cancel=True)
