"""HTTP/1.1 on one trio stream, as the request gate speaks it: a request's head and body read
with h11 (bounded), a JSON answer written whole, and a raw answer that closes the connection
(for a head h11 could not parse, or a connection turned away unread)."""

from __future__ import annotations

import contextlib
import http
import json

import h11
import trio

RECEIVE_SIZE = 65536


async def read_head(connection: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    """The next request's head; None when the client closed."""
    event = await _next_event(connection, stream)
    return event if isinstance(event, h11.Request) else None


async def read_body(connection: h11.Connection, stream: trio.SocketStream, *, limit: int) -> bytes:
    """The body of the request whose head was read; raises ``RemoteProtocolError`` past
    ``limit`` bytes (a chunked body declares no size)."""
    body = bytearray()
    while True:
        event = await _next_event(connection, stream)
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > limit:
                raise h11.RemoteProtocolError("request body too large")
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        else:
            raise h11.RemoteProtocolError(f"unexpected {event!r} in a request body")


async def _next_event(connection: h11.Connection, stream: trio.SocketStream) -> object:
    """h11's next event on ``connection``, receiving from ``stream`` until it has one."""
    while (event := connection.next_event()) is h11.NEED_DATA:
        connection.receive_data(await stream.receive_some(RECEIVE_SIZE))
    return event


async def send_json(
    connection: h11.Connection, stream: trio.SocketStream, status: int, content: bytes
) -> bool:
    """Send one JSON answer; False when the connection cannot carry it (then it closes)."""
    reply = h11.Response(
        status_code=status,
        headers=[("content-type", "application/json"), ("content-length", str(len(content)))],
    )
    try:
        # One write for the whole answer: each write releases the GIL, and taking it back
        # waits for the client's thread when that is busy (the OpenAI SDK in an eval fn's
        # asyncio thread), about a millisecond a write.
        await stream.send_all(
            b"".join(
                connection.send(event)
                for event in (reply, h11.Data(data=content), h11.EndOfMessage())
            )
        )
    except (h11.LocalProtocolError, trio.BrokenResourceError):
        return False
    return True


def closing_answer(status: int, content: bytes) -> bytes:
    """A whole JSON answer that closes the connection, written without h11 (for a connection
    whose request h11 has not read)."""
    phrase = http.HTTPStatus(status).phrase if status in http.HTTPStatus._value2member_map_ else ""
    head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(content)}\r\nconnection: close\r\n\r\n").encode()
    return head + content


async def send_closing(stream: trio.SocketStream, answer: bytes, *, drain: int = 0) -> None:
    """Send ``answer`` (from :func:`closing_answer`) within a second. With ``drain``, the
    sending side is then closed and what the client sent meanwhile read for the rest of that
    second, up to ``drain`` bytes: closing on unread data would reset the connection and lose
    the answer."""
    with contextlib.suppress(trio.BrokenResourceError), trio.move_on_after(1.0):
        await stream.send_all(answer)
        if drain:
            await stream.send_eof()
            drained = 0
            while drained < drain and (chunk := await stream.receive_some(drain)):
                drained += len(chunk)


def error_body(message: str) -> bytes:
    """The JSON body of an error answer, as the engines write theirs."""
    return json.dumps({"error": {"message": message}}).encode()
