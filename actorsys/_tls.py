"""The one TLS context every HTTP client of the fleet shares."""

from __future__ import annotations

import functools
import ssl


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """Building a context loads the CA bundle, about 50 ms of CPU: a client made per request
    (as the engine clients do, so that cancelling closes its connection) would pay that for
    every request, and a pin of four engines makes a dozen."""
    return ssl.create_default_context()
