"""The weight copy of a submit, done in the host's thread."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from actorsys.snapshot import CapturedWeights, capture
from actorsys.supervisor import Reservation


def copy_weights(
    reservation: Reservation, source: torch.nn.Module | Mapping[str, torch.Tensor]
) -> CapturedWeights:
    """Copy the weights of a reserved point into the buffer set the reservation leased from
    the supervisor's pool, in the calling (host) thread.

    The one place the bridge copies weights. Blocks the caller for the copy, never on the trio
    thread; afterwards the caller may change its weights freely. On an error the lease is
    given back, and the caller releases the reservation.
    """
    return capture(source, buffers=reservation.buffers, plan=reservation.plan)
