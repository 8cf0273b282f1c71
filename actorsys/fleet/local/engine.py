"""One engine of a :class:`~actorsys.fleet.local.LocalFleet`: its process, port, client and
state, and the door that refuses connections while the fleet has given up on it."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

import trio

from actorsys.fleet._proc.process import ManagedProcess
from actorsys.fleet.fleet import Engine
from actorsys.fleet.local.specs import EngineSpec


@dataclass
class LocalEngine:
    """One engine of a local fleet. ``state``: ``"running"``, ``"restarting"`` (it exited and
    is being started again) or ``"gave_up"`` (it exited too often; it stays down);
    ``restarts``: how often the fleet restarted it on its own."""

    name: str
    spec: EngineSpec
    port: int
    process: ManagedProcess
    client: Engine
    state: str = "running"
    restarts: int = 0
    listener: socket.socket | None = field(default=None, repr=False)
    """The listening socket the fleet bound for the engine and holds until it closes (None:
    the engine binds its own port)."""
    door: trio.CancelScope | None = field(default=None, repr=False)
    """While the fleet gave up on the engine: the task that refuses connections to its port."""
    lock: trio.Lock = field(default_factory=trio.Lock, repr=False)
    _changed: trio.Event = field(default_factory=trio.Event, repr=False)

    def set_state(self, state: str) -> None:
        self.state = state
        self._changed.set()
        self._changed = trio.Event()

    async def wait_state(self, state: str, *, restarts: int = 0) -> None:
        """Block until the engine is in ``state`` after at least ``restarts`` restarts."""
        while not (self.state == state and self.restarts >= restarts):
            await self._changed.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def refuse_while_down(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Reset every connection to the engine's port until ``LocalFleet.restart`` cancels
        ``door`` (the fleet gave up on the engine). The fleet keeps the port, so its clients
        would otherwise wait in the backlog for an engine that is not coming; reset, they
        fail at once, as on a closed port."""
        listener = self.listener
        assert listener is not None
        with trio.CancelScope() as door:
            self.door = door
            task_status.started()
            listener.setblocking(False)
            while True:
                await trio.lowlevel.wait_readable(listener)
                try:
                    connection, _ = listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                connection.close()
