"""Evaluation inside the trainers people already run, as one callback each.

- :mod:`actorsys.integrations.transformers`: ``EvalCallback`` for ``transformers.Trainer``
  and every TRL trainer (extra ``transformers``);
- :mod:`actorsys.integrations.lightning`: ``EvalCallback`` for ``lightning.pytorch.Trainer``
  (extra ``lightning``).

Neither is imported by ``import actorsys``: each needs its trainer library, and imports it
when it is imported itself.
"""
