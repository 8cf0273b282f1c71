"""The supervisor and the seam a host builds on.

``EvalSupervisor`` is the trio-native front of the pipeline. A host that runs it on behalf of
a trainer in another thread or event loop (the ``bridge`` package) takes ``submit``'s keyword
arguments as ``**arguments: Unpack[SubmitArguments]`` (their one definition) and uses the
two-step submit: ``SubmitRequest`` validates the arguments of ``submit`` once, ``EvalSupervisor.reserve``
returns a :class:`Reservation`, the host copies the weights in its own thread and hands them
to ``EvalSupervisor.launch`` (``is_collective_job``: whether this process is one rank of a
``torch.distributed`` job, whose submits are collective). Everything else of the pipeline
is private (``actorsys._core``).
"""

from actorsys._core.admission import Reservation
from actorsys._core.collective.protocol import is_collective_job
from actorsys._core.submit import SubmitArguments, SubmitRequest
from actorsys._core.supervisor import EvalSupervisor

__all__ = ["EvalSupervisor", "Reservation", "SubmitArguments", "SubmitRequest", "is_collective_job"]
