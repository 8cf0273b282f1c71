"""A reward server is bounded in time and size: ``remote_rm`` against real HTTP servers on
loopback that trickle their reply a byte at a time, or send far more than a reward, each ends
within its deadline or at its cap as a scorer error, counted, without its worker killed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from actorsys._errors import RemoteRewardError
from actorsys.evals import EvalDataset
from actorsys.evals.harnesses.sampling import score_answers
from actorsys.evals.scoring.metrics import dataset_metrics
from actorsys.evals.scoring.remote_rm import MAX_REPLY_BYTES, REPLY_SHARE, remote_reward
from actorsys.fleet.clients.completions import Completion

TRICKLE_SECONDS = 12.0
"""How long the trickling server sends (a byte every 20 ms): far past every deadline here."""
HUGE_BYTES = 64 * 1024 * 1024
"""What the huge servers send before closing (they declare, or stream, 900 MB)."""


class BadRewardServer:
    """``/trickle``: a 200 whose body comes a byte every 20 ms for :data:`TRICKLE_SECONDS`;
    ``/stall``: three bytes 0.55 s apart, then nothing for as long;
    ``/huge``: a body that declares 900 MB; ``/huge-chunked``: a chunked body of no declared
    length, :data:`HUGE_BYTES` of digits; ``/ok``: ``{"reward": 0.5}``."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        stop = self.stop

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    self._answer()
                except OSError:  # the client stopped reading: what is being tested
                    pass

            def _answer(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if self.path == "/ok":
                    self.send_header("Content-Length", "15")
                    self.end_headers()
                    self.wfile.write(b'{"reward": 0.5}')
                elif self.path == "/trickle":
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    end = time.monotonic() + TRICKLE_SECONDS
                    while time.monotonic() < end and not stop.wait(0.02):
                        self.wfile.write(b"1")
                        self.wfile.flush()
                elif self.path == "/stall":
                    self.send_header("Content-Length", "1000000")
                    self.end_headers()
                    for _ in range(3):  # a byte just before the deadline, then silence
                        stop.wait(0.55)
                        self.wfile.write(b"1")
                        self.wfile.flush()
                    stop.wait(TRICKLE_SECONDS)
                elif self.path == "/huge":
                    self.send_header("Content-Length", str(900 * 1024 * 1024))
                    self.end_headers()
                    self._send_digits(chunked=False)
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self._send_digits(chunked=True)
                self.close_connection = True

            def _send_digits(self, *, chunked: bool) -> None:
                block = b"1" * 65536
                for _ in range(HUGE_BYTES // len(block)):
                    if stop.is_set():
                        return
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def bad_server() -> Iterator[BadRewardServer]:
    server = BadRewardServer()
    try:
        yield server
    finally:
        server.close()


def reward(url: str, timeout: float) -> float:
    return remote_reward(url, prompt="p", response="r", label="1", metadata=None, timeout=timeout)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("route", ["trickle", "stall"])
def test_a_trickling_reply_is_cut_at_the_calls_deadline(
    bad_server: BadRewardServer, route: str
) -> None:
    start = time.monotonic()
    with pytest.raises(RemoteRewardError, match="no whole answer within 1.8 s"):
        reward(f"{bad_server.url}/{route}", timeout=2.0)
    elapsed = time.monotonic() - start
    # each byte comes within any per-read timeout, which restarts with it: only a deadline
    # on the whole call ends it (and, for the stall, wakes the read blocked past it)
    assert 2.0 * REPLY_SHARE - 0.1 <= elapsed < 2.0 * REPLY_SHARE + 0.4
    assert reward(f"{bad_server.url}/ok", timeout=2.0) == 0.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("route", ["huge", "huge-chunked"])
def test_a_reply_over_the_cap_is_refused_without_reading_it_whole(
    bad_server: BadRewardServer, route: str
) -> None:
    with pytest.raises(RemoteRewardError, match=rf"{MAX_REPLY_BYTES} (are read|bytes; stopped)"):
        reward(f"{bad_server.url}/{route}", timeout=20.0)


@pytest.mark.timeout(120)
async def test_bounded_replies_score_zero_and_count_without_killing_the_worker(
    bad_server: BadRewardServer,
) -> None:
    records = ({"prompt": "question", "label": "1"},)
    for route in ("trickle", "huge-chunked"):
        dataset = EvalDataset(name="rm", records=records, scorer="remote_rm",
                              rm_url=f"{bad_server.url}/{route}", score_timeout=2.0)
        [sample] = await score_answers(dataset, [Completion(0, "p", "1", "stop", "1", "fake://", 1)])
        assert sample.score == 0.0
        # the worker reported the reward server's error itself: it was not killed for time
        assert sample.error is not None
        assert "RemoteRewardError" in sample.error, sample.error
        assert dataset_metrics("rm", [sample], 1)["eval/rm/scorer_errors"] == 1.0
