"""Collective submits across the ranks of a torch.distributed job: the protocol over the job's
store, its messages, the handover, a contributor's side.
"""
