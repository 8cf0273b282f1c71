"""The points in flight, defined in :mod:`actorsys.actors.flight`."""

from actorsys.actors.flight import Flight

__all__ = ["Flight"]
