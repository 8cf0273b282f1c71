"""The weight copy of a submit, done in the host's thread."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from actorsys import snapshot
from actorsys.supervisor import Reservation


def copy_weights(
    reservation: Reservation, source: torch.nn.Module | Mapping[str, torch.Tensor]
) -> snapshot.CapturedWeights:
    """Copy the weights of a reserved point, in the calling (host) thread.

    The one place the bridge copies weights. Blocks the caller for the copy, never on the trio
    thread; afterwards the caller may change its weights freely.
    """
    del reservation
    return snapshot.capture(source)
