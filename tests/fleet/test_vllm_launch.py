"""The one builder of a vLLM server's command line: every server actorsys starts gets the
weight-update endpoints, the key and weight-version middlewares (the key outermost) and,
unless told otherwise, the worker extension."""

from __future__ import annotations

import os

from actorsys.evals import EvalDataset, ServerEvalFn
from actorsys.fleet.clients.vllm import RELOAD, TIED_RELOAD
from actorsys.fleet.local import vllm
from actorsys.fleet.vllm_launch import EXTENSION_FLAG, MIDDLEWARE_FLAG, vllm_command, vllm_launch
from actorsys.fleet.vllm_worker import (
    API_KEY_MIDDLEWARE,
    EXTENSION_CLASS,
    WEIGHT_VERSION_MIDDLEWARE,
    WORKER_DIR,
)

ARGV = vllm_command("/venv/bin/python", "/models/base", 8000)
# vLLM wraps the app in each --middleware in turn: the last, the key's, is the outermost
MIDDLEWARES = [MIDDLEWARE_FLAG, WEIGHT_VERSION_MIDDLEWARE, MIDDLEWARE_FLAG, API_KEY_MIDDLEWARE]


def test_a_launch_gets_the_dev_mode_the_key_guard_and_the_worker_extension_first_on_its_path(
) -> None:
    launch = vllm_launch(ARGV, environ={"PYTHONPATH": "/mine"})
    assert launch.argv == [*ARGV, EXTENSION_FLAG, EXTENSION_CLASS, *MIDDLEWARES]
    assert launch.env == {"VLLM_SERVER_DEV_MODE": "1",
                          "PYTHONPATH": os.pathsep.join([WORKER_DIR, "/mine"])}


def test_an_extension_of_the_users_own_or_no_tied_reload_is_left_alone() -> None:
    own = [*ARGV, EXTENSION_FLAG, "theirs.Extension"]
    assert vllm_launch(own, environ={}).argv == [*own, *MIDDLEWARES]
    plain = vllm_launch(ARGV, tied_reload=False, environ={"PYTHONPATH": "/mine"})
    assert plain.argv == [*ARGV, *MIDDLEWARES]
    assert plain.env == {"VLLM_SERVER_DEV_MODE": "1",
                         "PYTHONPATH": os.pathsep.join([WORKER_DIR, "/mine"])}


def test_the_local_fleet_builds_its_vllm_command_with_it() -> None:
    spec = vllm("/models/base", python="/venv/bin/python")
    assert spec.command(8000) == vllm_launch(ARGV).argv
    assert spec.env == vllm_launch(ARGV).env


def test_the_local_fleets_vllm_client_reloads_through_the_extension_it_was_started_with() -> None:
    url = "http://127.0.0.1:8000"
    tied = vllm("/models/base", python="/venv/bin/python").make_client(url, "e", "k")
    plain = vllm("/models/base", python="/venv/bin/python", tied_reload=False)
    assert getattr(tied, "reload_method", None) == TIED_RELOAD
    assert getattr(plain.make_client(url, "e", "k"), "reload_method", None) == RELOAD
    assert plain.command(8000) == vllm_launch(ARGV, tied_reload=False).argv


def test_server_eval_fn_gives_a_launched_vllm_the_extension_unless_it_names_its_own() -> None:
    data = EvalDataset(name="d", records=({"prompt": "p", "label": "x"},))
    argv = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--port", "{port}"]
    assert ServerEvalFn(data, launch=argv).tied_reload
    assert not ServerEvalFn(data, launch=[*argv, EXTENSION_FLAG, "theirs.X"]).tied_reload
    assert not ServerEvalFn(data, launch=argv, flavor="sglang").tied_reload


def test_a_named_tool_call_parser_turns_on_vllms_tool_calls_in_chat() -> None:
    argv = vllm_command("/venv/bin/python", "/models/base", 8000, tool_call_parser="hermes",
                        extra_args=["--seed", "1"])
    assert argv[-5:] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--seed", "1"]
    assert "--tool-call-parser" not in ARGV
    spec = vllm("/models/base", python="/venv/bin/python", tool_call_parser="hermes")
    assert spec.command(8000)[: len(argv) - 2] == argv[:-2]
