"""The point the actors pass along, defined in :mod:`actorsys.actors.point`."""

from actorsys.actors.point import ExportFn, FleetLease, Owner, Point, Source, State, Ticket

__all__ = ["ExportFn", "FleetLease", "Owner", "Point", "Source", "State", "Ticket"]
