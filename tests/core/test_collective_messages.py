"""A contributor rank trusts nothing the job's store holds: a malformed or crafted message is
a clean skip (``_PeerGoneError``), never a write outside ``hf_dir`` or a JSON error in the
trainer's ``submit``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from actorsys import EvalConfig
from actorsys._core.collective.protocol import Collective, _PeerGoneError
from actorsys.snapshot._sharded.write import Piece, Sharding, write_pieces


def contributor(tmp_path: Path) -> tuple[Collective, dist.HashStore]:
    store = dist.HashStore()
    config = EvalConfig(hf_dir=str(tmp_path / "hf"), collective_timeout=5.0)
    store.set("beat", "1")
    return Collective(config, store, rank=1, world=2), store


@pytest.mark.parametrize(
    "message",
    [b"\xff\xfe not utf-8", b"not json", b"[1, true]", b'{"step": 1}', b'["1", true, null]',
     b"[" * 100_000],
)
def test_a_malformed_decision_is_a_skip_not_an_error_in_submit(
    tmp_path: Path, message: bytes
) -> None:
    collective, store = contributor(tmp_path)
    store.set("decision/0", message)
    with pytest.raises(_PeerGoneError, match="malformed"):
        collective.wait_decision()


def test_a_well_formed_decision_passes(tmp_path: Path) -> None:
    collective, store = contributor(tmp_path)
    store.set("decision/0", "[3, true, null]")
    decision = collective.wait_decision()
    assert (decision.step, decision.admitted, decision.error) == (3, True, None)


@pytest.mark.parametrize(
    "ready",
    [
        '{"directory": "/etc", "starts": {"passwd": {"w": 0}}}',
        '{"directory": "{hf}/../elsewhere", "starts": {}}',
        '{"directory": "{hf}", "starts": {}}',
        '{"directory": "{hf}/step1", "starts": {"/etc/passwd": {"w": 0}}}',
        '{"directory": "{hf}/step1", "starts": {"../../x": {"w": 0}}}',
        '{"directory": "{hf}/step1", "starts": {"model.safetensors": {"w": -8}}}',
        '{"directory": "{hf}/step1", "starts": {"model.safetensors": {"w": 1.5}}}',
        '{"directory": "{hf}/step1", "starts": ["model.safetensors"]}',
        '"a string"',
        "not json",
    ],
)
def test_a_crafted_ready_message_is_refused(tmp_path: Path, ready: str) -> None:
    collective, store = contributor(tmp_path)
    hf = str(tmp_path / "hf")
    store.set("ready/1", ready.replace("{hf}", hf))
    with pytest.raises(_PeerGoneError, match="malformed"):
        collective.wait_ready(1, lambda: None)


def test_a_ready_message_inside_hf_dir_passes(tmp_path: Path) -> None:
    collective, store = contributor(tmp_path)
    (tmp_path / "hf" / "step1").mkdir(parents=True)
    directory = str(tmp_path / "hf" / "step1")
    store.set("ready/1", f'{{"directory": "{directory}", "starts": {{"m.safetensors": {{"w": 8}}}}}}')
    assert collective.wait_ready(1, lambda: None) == (directory, {"m.safetensors": {"w": 8}})
    store.set("ready/2", "null")
    assert collective.wait_ready(2, lambda: None) is None


def shard_weights() -> Any:
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    sharding = Sharding({"w": Piece(torch.float32, (4, 3), (2, 3), (2, 0), "self")})
    return SimpleNamespace(sharding=sharding, tensors={"w": tensor})


@pytest.mark.parametrize("start", [0, 24, 40])
def test_a_shard_range_past_its_file_is_refused_before_any_write(
    tmp_path: Path, start: int
) -> None:
    # 4x3 float32 = 48 bytes; this rank's rows 2-3 are bytes 24..48 past their tensor's start.
    (tmp_path / "m.safetensors").write_bytes(b"\0" * 64)
    if start == 0:
        write_pieces(shard_weights(), str(tmp_path), {"m.safetensors": {"w": 0}},
                     evaluating=False, check=lambda: None)
        assert (tmp_path / "m.safetensors").read_bytes()[24:48] != b"\0" * 24
        return
    with pytest.raises(ValueError, match="not inside the file"):
        write_pieces(shard_weights(), str(tmp_path), {"m.safetensors": {"w": start}},
                     evaluating=False, check=lambda: None)
    assert (tmp_path / "m.safetensors").read_bytes() == b"\0" * 64


def test_a_shard_file_that_is_a_link_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"\0" * 64)
    (tmp_path / "m.safetensors").symlink_to(victim)
    with pytest.raises(OSError, match="symbolic links"):
        write_pieces(shard_weights(), str(tmp_path), {"m.safetensors": {"w": 0}},
                     evaluating=False, check=lambda: None)
    assert victim.read_bytes() == b"\0" * 64
