"""The four actors of the pipeline, each the owner of its own state.

- :class:`~actorsys.actors.exporter.Exporter`: the points waiting for their export, the one
  being written, and their captured weights;
- :class:`~actorsys.actors.pinner.FleetPinner`: the idle fleets, and the points waiting for one;
- :class:`~actorsys.actors.runner.EvalRunner`: the points being evaluated and their fleets;
- :class:`~actorsys.actors.retirer.Retirer`: the sink, the counters, the snapshot ring and
  the files still to delete.

The working stages share one loop (:mod:`actorsys.actors.stage`).
"""
