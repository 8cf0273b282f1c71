"""The supervisor and the seam a host builds on.

``EvalSupervisor`` is the trio-native front of the pipeline. A host that runs it on behalf of
a trainer in another thread or event loop (the ``bridge`` package) takes ``submit``'s keyword
arguments as ``**arguments: Unpack[SubmitArguments]`` (their one definition) and uses the
two-step submit: ``SubmitRequest`` validates the arguments of ``submit`` once, ``EvalSupervisor.reserve``
returns a :class:`Reservation`, the host copies the weights in its own thread and hands them
to ``EvalSupervisor.launch``. Everything else of the pipeline is private (``actorsys._core``).
"""

from actorsys._core.admission import Reservation
from actorsys._core.submit import SubmitArguments, SubmitRequest
from actorsys._core.supervisor import EvalSupervisor

__all__ = ["EvalSupervisor", "Reservation", "SubmitArguments", "SubmitRequest"]
