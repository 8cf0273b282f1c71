"""The points in flight: one :class:`~actorsys.actors.point.Ticket` per admitted step, each holding
a slot from admission until the Retirer has deleted its files."""

from __future__ import annotations

from collections.abc import Iterator

import trio

from actorsys.actors.point import Point, State, Ticket


class Flight:
    """Tickets by step, and the one place waiters learn that a slot may have freed."""

    def __init__(self) -> None:
        self._tickets: dict[int, Ticket] = {}
        self._changed = trio.lowlevel.ParkingLot()
        self._token = trio.lowlevel.current_trio_token()

    def __len__(self) -> int:
        """Slots taken: every ticket, settled or not, until its files are gone."""
        return len(self._tickets)

    def __iter__(self) -> Iterator[Ticket]:
        return iter(list(self._tickets.values()))

    def get(self, step: int) -> Ticket | None:
        return self._tickets.get(step)

    def unsettled(self) -> list[int]:
        return sorted(t.step for t in self._tickets.values() if t.state is not State.SETTLED)

    def admit(self, point: Point) -> Ticket:
        ticket = self._tickets[point.step] = Ticket(point)
        return ticket

    def free(self, step: int) -> None:
        """The point's files are gone: its slot is free."""
        self._tickets.pop(step, None)
        self.wake()

    async def wait_changed(self) -> None:
        """Block until a point settles or frees its slot (or ``wake`` is called)."""
        await self._changed.park()

    def wake(self) -> None:
        self._changed.unpark_all()

    def wake_from_any_thread(self) -> None:
        try:
            self._token.run_sync_soon(self.wake)
        except trio.RunFinishedError:
            pass
