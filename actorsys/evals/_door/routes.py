"""What passes the request gate, judged on a request's head alone: its token, its route, its
headers and its declared size; and what of it is forwarded (the path after the token, the
headers passed on). The gate itself is :class:`~actorsys.evals._door.gate.RequestGate`."""

from __future__ import annotations

import hmac

import h11

from actorsys.evals._door.http_wire import error_body
from actorsys.fleet.vllm_worker.actorsys_weight_version import VERSION_HEADER

ROUTES = frozenset({
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
})
"""The (method, path) pairs the gate forwards; the path after the token must be exactly one
of these (no query, no other spelling). ``/health`` changes nothing and needs no key."""
FORWARDED_HEADERS = frozenset({"content-type", "accept", "user-agent", "x-request-id",
                               VERSION_HEADER})
"""The client headers passed on (the client's ``authorization`` too, when the gate has no key
of its own; the version stamp is the gate's own when it pins one); every other header,
hop-by-hop ones included, stays at the gate."""
MAX_BODY = 16 * 1024 * 1024
"""The largest request body forwarded (lm-eval's batches of prompts are far smaller); a larger
one is refused (413) before it is read."""
GATE_ENDED = "no such gate (the evaluation it served has ended)"
"""What a request with a wrong token (or to a gate that saw stale weights) is told."""


def token_ok(request: h11.Request, token: str) -> bool:
    """Whether the target starts with ``/TOKEN/`` (compared in constant time)."""
    parts = request.target.split(b"/", 2)
    if len(parts) < 3 or parts[0] != b"":
        return False
    return hmac.compare_digest(parts[1], token.encode())


def refusal(request: h11.Request, token: str, *, ended: bool) -> tuple[int, bytes] | None:
    """Why ``request`` is refused on its head alone (the status and the body to answer), or
    None; ``ended``: the gate forwards nothing more."""
    if not token_ok(request, token) or ended:
        return 404, error_body(GATE_ENDED)
    path = b"/" + request.target.split(b"/", 2)[2]
    method = request.method
    if (method.decode("latin-1"), path.decode("latin-1")) not in ROUTES:
        routes = ", ".join(f"{m} {p}" for m, p in sorted(ROUTES))
        known = any(path.decode("latin-1") == p for _, p in ROUTES)
        return (405 if known else 404), error_body(f"the gate forwards only {routes}")
    for name, value in request.headers:
        if not value.isascii():
            return 400, error_body(f"header {name.decode('latin-1')!r}: the value is not ASCII")
        if name == b"content-length" and (not value.isdigit() or int(value) > MAX_BODY):
            return 413, error_body(f"request body over {MAX_BODY} bytes")
    return None


def forwarded_parts(
    request: h11.Request, *, client_authorization: bool
) -> tuple[str, str, dict[str, str]]:
    """Method, path after the token (one of :data:`ROUTES`) and the headers passed on (the
    client's ``authorization`` among them with ``client_authorization``)."""
    allowed = FORWARDED_HEADERS | {"authorization"} if client_authorization else FORWARDED_HEADERS
    headers = {
        name.decode("ascii"): value.decode("ascii")
        for name, value in request.headers
        if name.decode("ascii", "replace") in allowed
    }
    path = "/" + request.target.split(b"/", 2)[2].decode("ascii")
    return request.method.decode("ascii"), path, headers
