"""miles' reward types with miles' semantics, on the edge cases that tell them from a plain
math check: deepscaler grades only what follows the thinking, dapo reads the last ``Answer:``
line, f1, gpqa, ``boxed_``, ``remote_rm`` against a reward server on loopback (one that answers
500 scores 0 and counts), a record's own ``rm_type``, dotted-path scorers, and ``maj@n``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from actorsys import ConfigError
from actorsys.evals import DatasetError, EvalDataset, score
from actorsys.evals.harnesses.sampling import evaluate_datasets, majority_votes, score_answers
from actorsys.evals.scoring.metrics import dataset_metrics
from actorsys.fleet.clients.completions import Completion
from tests.fakes import ScriptedFleet

THOUGHT = "<think>\nso 2+2 is 5? no, \\boxed{5} is wrong\n</think>\n\n"
PLAIN_THOUGHT = "<think>\nlet me add them up\n</think>\n\n"


def half_length(answer: str, label: object, record: dict) -> float:
    """A custom scorer named by its dotted path in the tests below."""
    return 1.0 if len(answer) == len(str(label)) else 0.5


@pytest.mark.parametrize(
    ("scorer", "answer", "label", "miles", "math"),
    [
        # deepscaler: only after </think> (or ###Response); no marker scores 0; a box needed
        ("deepscaler", "\\boxed{4}", "4", 0.0, 1.0),
        ("deepscaler", THOUGHT + "The answer is \\boxed{4}.", "4", 1.0, 1.0),
        ("deepscaler", "<think>\\boxed{4}</think> I am not sure", "4", 0.0, 1.0),
        ("deepscaler", PLAIN_THOUGHT + "so it is 4", "4", 0.0, 1.0),
        ("deepscaler", "###Response the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0, 1.0),
        ("deepscaler", THOUGHT + "\\boxed{4}", "\\boxed{4}", 1.0, 1.0),
        ("deepscaler", PLAIN_THOUGHT + "\\boxed 4", "4", 0.0, 1.0),
        # dapo: the last "Answer:" line of the last 300 characters, Minerva-normalized
        ("dapo", "so the result is 12", "12", 0.0, 1.0),
        ("dapo", "Answer: 3\nthen again\nAnswer: 12", "12", 1.0, 1.0),
        ("dapo", "Answer: $12$ dollars", "12", 1.0, 1.0),
        ("dapo", "Answer: \\boxed{12}", "12.0", 1.0, 1.0),
        ("dapo", "Answer: 12" + " and so on" * 40, "12", 0.0, 1.0),
        ("dapo", "Answer: 1/2", "0", 0.0, 0.0),
        # f1: token overlap after normalization
        ("f1", "The Eiffel Tower!", "eiffel tower", 1.0, 0.0),
        ("f1", "no", "yes", 0.0, 0.0),
        # gpqa: the letter after the thinking; "I" is no option; the right choice's text counts
        ("gpqa", "<think>the answer is A</think> The answer is C", "C", 1.0, 0.0),
        ("gpqa", "I would say D", "D", 1.0, 0.0),
        # boxed_<scorer>: the last box's content, then the scorer
        ("boxed_exact", "it is \\boxed{2/4}", "1/2", 0.0, 1.0),
        ("boxed_math", "the answer is 4", "4", 0.0, 1.0),
        ("boxed_f1", "so \\boxed{the Eiffel tower}", "eiffel tower", 1.0, 0.0),
    ],
)
def test_each_reward_type_scores_as_miles_does_where_math_would_not(
    scorer: str, answer: str, label: str, miles: float, math: float
) -> None:
    assert score(scorer, answer, label) == miles
    assert score("math", answer, label) == math


def test_f1_counts_partial_overlap() -> None:
    assert score("f1", "the cat sat", "a cat sat down") == pytest.approx(0.8)


def test_gpqa_reads_labels_as_letters_indices_or_choice_text() -> None:
    record = {"metadata": {"choices": ["red", "green", "blue"]}}
    assert score("gpqa", "Answer: B", 1, record) == 1.0
    assert score("gpqa", "Answer: B", "green", record) == 1.0
    assert score("gpqa", "it must be green", "green", record) == 1.0  # no letter: the text
    assert score("gpqa", "Answer: C", "green", record) == 0.0
    assert score("gpqa", "I cannot decide", "C", None) == 0.0  # no letter inside a word


def test_a_dapo_label_that_is_not_an_integer_is_refused_at_construction() -> None:
    with pytest.raises(DatasetError, match="dapo grades integer answers"):
        EvalDataset(name="d", records=({"prompt": "p", "label": "x/2"},), scorer="dapo")


def test_a_dotted_path_scorer_grades_and_one_that_does_not_import_is_refused() -> None:
    path = f"{__name__}.half_length"
    assert score(path, "abc", "xyz") == 1.0
    assert score(path, "abcd", "xyz") == 0.5
    with pytest.raises(ConfigError, match="'tests.nowhere.fn' does not import"):
        EvalDataset(name="d", records=({"prompt": "p", "label": "1"},), scorer="tests.nowhere.fn")
    with pytest.raises(ConfigError, match="unknown scorer 'boxed_boxed_math'"):
        EvalDataset(name="d", records=({"prompt": "p", "label": "1"},), scorer="boxed_boxed_math")


class RewardServer:
    """A reward server on loopback: ``/judge`` gives ``{"reward": 0.25}`` for a response
    holding the label (else 0) and records every payload, ``/plain`` answers a bare number,
    ``/broken`` answers 500, ``/garbage`` a string, ``/hang`` nothing until the test ends."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.payloads.append({"path": self.path, **body})
                if self.path == "/hang":
                    server.release.wait(30)
                status, reply = {
                    "/judge": (200, {"reward": 0.25 if str(body["label"]) in body["response"] else 0}),
                    "/plain": (200, 1),
                    "/broken": (500, {"error": "down"}),
                    "/garbage": (200, "great answer"),
                }.get(self.path, (404, {}))
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def reward_server() -> Iterator[RewardServer]:
    server = RewardServer()
    try:
        yield server
    finally:
        server.close()


def completions(*texts: str) -> list[Completion]:
    return [Completion(i, "p", text, "stop", "1", "fake://", 3) for i, text in enumerate(texts)]


@pytest.mark.timeout(120)
async def test_remote_rm_posts_from_the_worker_and_failures_score_zero_and_count(
    reward_server: RewardServer,
) -> None:
    records = tuple({"prompt": f"question {i}", "label": str(i), "metadata": {"id": i}}
                    for i in range(2))
    dataset = EvalDataset(name="rm", records=records, scorer="remote_rm",
                          rm_url=f"{reward_server.url}/judge", metadata_key="metadata",
                          score_timeout=5.0)
    samples = await score_answers(dataset, completions("it is 0", "it is 7"),
                                  shown=["<rendered 0>", "<rendered 1>"])
    assert [s.score for s in samples] == [0.25, 0.0]
    assert [s.error for s in samples] == [None, None]
    judged = sorted(reward_server.payloads, key=lambda p: p["label"])
    assert judged[0] == {"path": "/judge", "prompt": "<rendered 0>", "response": "it is 0",
                         "label": "0", "metadata": {"id": 0}}

    plain = EvalDataset(name="rm", records=records[:1], scorer="remote_rm",
                        rm_url=f"{reward_server.url}/plain")
    assert [s.score for s in await score_answers(plain, completions("x"))] == [1.0]
    for route in ("broken", "garbage", "hang"):  # the hung one last: its worker is killed
        failing = EvalDataset(name="rm", records=records[:1], scorer="remote_rm",
                              rm_url=f"{reward_server.url}/{route}", score_timeout=1.0)
        [sample] = await score_answers(failing, completions("it is 0"))
        assert sample.score == 0.0
        assert sample.error is not None, route
        metrics = dataset_metrics("rm", [sample], 1)
        assert metrics["eval/rm/scorer_errors"] == 1.0


def test_remote_rm_needs_an_rm_url() -> None:
    with pytest.raises(DatasetError, match=r"rm_url \(--rm-url\)"):
        EvalDataset(name="d", records=({"prompt": "p", "label": "1"},), scorer="remote_rm")
    records = ({"prompt": "p", "label": "1", "meta": {"rm_type": "remote_rm"}},)
    with pytest.raises(DatasetError, match=r"meta.rm_type: remote_rm grades through"):
        EvalDataset(name="d", records=records, metadata_key="meta")


@pytest.mark.timeout(120)
async def test_a_records_own_rm_type_overrides_the_datasets_scorer() -> None:
    records = (
        {"prompt": "a", "label": "4", "meta": {"rm_type": "deepscaler"}},
        {"prompt": "b", "label": "eiffel tower", "meta": {"rm_type": "f1"}},
        {"prompt": "c", "label": "4"},
        {"prompt": "d", "label": "4", "meta": None},
    )
    dataset = EvalDataset(name="mixed", records=records, metadata_key="meta", scorer="math")
    answers = completions("\\boxed{4}", "The Eiffel Tower", "\\boxed{4}", "4")
    assert [s.score for s in await score_answers(dataset, answers)] == [0.0, 1.0, 1.0, 1.0]
    custom = EvalDataset(name="custom", records=records, metadata_key="meta",
                         scorer=f"{__name__}.half_length")
    assert [s.score for s in await score_answers(custom, answers)] == [0.5, 0.5, 0.5, 1.0]


@pytest.mark.timeout(120)
async def test_maj_at_n_votes_over_the_extracted_answers() -> None:
    script = {
        "p1": [THOUGHT + "\\boxed{4}", THOUGHT + "\\boxed{3}", THOUGHT + "\\boxed{4}"],
        "p2": [THOUGHT + "\\boxed{3}", THOUGHT + "\\boxed{3}", THOUGHT + "\\boxed{4}"],
        "p3": ["\\boxed{4}", "no thinking", THOUGHT + "\\boxed{4}"],
    }
    records = tuple({"prompt": p, "label": "4"} for p in script)
    dataset = EvalDataset(name="m", records=records, scorer="deepscaler", n_samples=3,
                          temperature=1.0)
    fleet = ScriptedFleet(lambda prompt, k: script[prompt][k])
    output = await evaluate_datasets(fleet, [dataset], concurrency=4, request_timeout=10.0,
                                     retries=0)
    metrics = output.metrics or {}
    assert metrics["eval/m/maj@3"] == pytest.approx(2 / 3)  # p1 and p3 (one vote, right)
    assert metrics["eval/m"] == pytest.approx(4 / 9)
    plain = EvalDataset(name="e", records=records, scorer="exact", n_samples=3)
    answers = completions(*(["x"] * 9))
    assert await majority_votes(plain, await score_answers(plain, answers)) is None
