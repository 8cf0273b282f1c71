"""An external server (a vLLM or sglang server outside the pipeline's fleets) as a Fleet
(:mod:`~actorsys.fleet.external.server`; its ``launch=`` argv: :mod:`~actorsys.fleet.external.launch`)."""

from actorsys.fleet._proc.process import ManagedProcess
from actorsys.fleet.external.server import ExternalServer

__all__ = [
    "ExternalServer",
    "ManagedProcess",
]
