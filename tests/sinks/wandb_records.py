"""Reads the history rows back out of an offline wandb run's ``run-<id>.wandb`` file.

The file is wandb's header (``:W&B``, magic, version) followed by a LevelDB-style log: 32 KiB
blocks of chunks, each ``crc32c(4) length(2, little-endian) type(1)`` then the payload; the
chunks of one record are FULL, or FIRST MIDDLE... LAST. Each record is a protobuf ``Record``.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER_BYTES = 7
BLOCK_BYTES = 32 * 1024
CHUNK_HEADER_BYTES = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    records: list[bytes] = []
    pending = b""
    offset = HEADER_BYTES
    while offset + CHUNK_HEADER_BYTES <= len(data):
        left_in_block = BLOCK_BYTES - offset % BLOCK_BYTES
        if left_in_block < CHUNK_HEADER_BYTES:
            offset += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + CHUNK_HEADER_BYTES])
        offset += CHUNK_HEADER_BYTES
        chunk = data[offset : offset + length]
        offset += length
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            records.append(pending + chunk)
            pending = b""
        else:
            break
    return records


def _records(path: Path) -> list[Any]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    records = []
    for payload in _payloads(data):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def _finished_records(run_dir: Path, timeout: float) -> list[Any]:
    (path,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    records = _records(path)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout} s"
        time.sleep(0.1)
        records = _records(path)
    return records


def step_metrics(run_dir: Path, *, timeout: float = 30.0) -> dict[str, str]:
    """``define_metric`` records of the run: metric name or glob -> its step metric."""
    return {
        r.metric.name or r.metric.glob_name: r.metric.step_metric
        for r in _finished_records(run_dir, timeout)
        if r.WhichOneof("record_type") == "metric"
    }


def history_rows(run_dir: Path, *, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every ``run.log`` row of the offline run in ``run_dir``, in order, as plain dicts.

    wandb's service process may still be writing the file after ``finish()`` returns, so
    this waits (up to ``timeout`` seconds) for the run's ``exit`` record."""
    rows: list[dict[str, Any]] = []
    for record in _finished_records(run_dir, timeout):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows
