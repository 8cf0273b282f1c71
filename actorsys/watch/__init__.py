"""The checkpoint-watching service behind ``actorsys watch``: a scan of a checkpoint
directory, an append-only ledger of what was evaluated, and the loop that feeds the complete
checkpoints to an :class:`~actorsys.EvalSupervisor` in step order."""
