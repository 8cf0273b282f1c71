"""Checks that a checkpoint directory can be loaded by an engine that serves another one.

An engine asked to load a checkpoint that does not fit may die rather than refuse: vLLM's
``reload_weights`` with a missing path or wrong shapes kills the server a moment later while
``/health`` still answers 200. So a checkpoint is checked *before* any engine is asked to load
it: the directory exists, carries the ``.complete`` marker where that is required, its config
describes the same architecture as the served model, and every safetensors file has a readable
header whose tensors fit in the file and match the served model's names and shapes.

Only headers are read (a few KB per shard), never the tensor data, and only from regular
files: a FIFO, device or socket in a checkpoint (reached directly or through a link) is refused
at once, before anything is opened, since opening a FIFO blocks until someone writes to it and
reading a device never ends. A link to a regular file is fine.

The files a tokenizer is read from (every file of a snapshot but its weight shards and the
model's configs, and those of ``additional_chat_templates/``) must lie in the snapshot: one
that is a link leading outside it is refused (:func:`check_tokenizer_files`), since its text
would be read as the snapshot's own (a ``chat_template.jinja`` that links to
``~/.ssh/id_rsa`` lands in every rendered prompt, the samples and ``metrics.jsonl``). A link
inside the snapshot is fine, and so are weights and configs linked to a shared store: they
are read as tensors and as numbers, their headers and keys checked.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from dataclasses import dataclass
from typing import IO, Any

from actorsys._errors import CheckpointMismatchError
from actorsys.staging import COMPLETE

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"

ARCHITECTURE_KEYS = (
    "model_type",
    "architectures",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)
"""Config keys that must agree for one checkpoint's weights to fit another's model."""

DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]


def special_file(path: str) -> str | None:
    """The first entry directly in directory ``path`` that is neither a regular file nor a
    directory once links are followed (a FIFO, a device, a socket), as ``"name (a FIFO)"``;
    None if there is none. Stats only (a stat of a FIFO never blocks); a dangling link or a
    loop of links is no such entry. Blocking."""
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                mode = entry.stat(follow_symlinks=True).st_mode
            except OSError:  # a dangling link, a loop of links: nothing that can be opened
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return f"{entry.name!r} ({_kind(mode)})"
    return None


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
"""The files of a snapshot that are its weights, never read as text."""
MODEL_CONFIGS = frozenset({CONFIG, "generation_config.json"})
"""The model's configs: read as numbers and names, never as a tokenizer's text."""
CHAT_TEMPLATES_DIR = "additional_chat_templates"
"""Where transformers reads a tokenizer's named chat templates from (``NAME.jinja``)."""


def link_outside(path: str) -> str | None:
    """The first tokenizer file of snapshot ``path`` (every entry directly in it but the
    weight shards and the model's configs, and the entries of ``additional_chat_templates/``)
    that is a link leading outside ``path``, as ``"'name'"``; None if there is none. A
    dangling link that points outside counts. Stats only; blocking."""
    root = os.path.realpath(path)
    for directory in (path, os.path.join(path, CHAT_TEMPLATES_DIR)):
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.endswith(WEIGHT_SUFFIXES) or (
                directory == path and entry.name in MODEL_CONFIGS
            ):
                continue
            target = os.path.realpath(entry.path)
            if target != root and not target.startswith(root + os.sep):
                return repr(os.path.relpath(entry.path, path))
    return None


def check_tokenizer_files(path: str) -> None:
    """Refuse snapshot ``path`` if a file its tokenizer is read from is a link leading
    outside it (:func:`link_outside`): :class:`CheckpointMismatchError` naming the
    file. Blocking (stats only)."""
    try:
        outside = link_outside(path)
    except OSError as exc:
        raise CheckpointMismatchError(path, f"cannot be listed: {exc}") from exc
    if outside is not None:
        raise CheckpointMismatchError(
            path, f"{outside} is a link leading outside the snapshot; its tokenizer files must "
                  "lie in it (a link inside it is fine)")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str, file: str) -> IO[bytes]:
    """``file`` of checkpoint ``path`` opened for reading, only if it is a regular file (a
    link to one is fine). Raises :class:`CheckpointMismatchError` for anything else, without
    waiting: it is opened non-blocking and checked again on the open descriptor, so a file
    swapped for a FIFO in between is refused too. ``FileNotFoundError`` where it is missing."""
    name = os.path.basename(file)
    mode = os.stat(file).st_mode
    if not stat.S_ISREG(mode):
        raise CheckpointMismatchError(path, f"{name} is {_kind(mode)}, not a regular file")
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CheckpointMismatchError(path, f"{name} is {_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_config(path: str) -> dict[str, Any]:
    """The parsed ``config.json`` of checkpoint ``path``."""
    config_path = os.path.join(path, CONFIG)
    try:
        with open_regular(path, config_path) as f:
            config = json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointMismatchError(path, f"has no {CONFIG}") from None
    except (OSError, ValueError) as exc:
        raise CheckpointMismatchError(path, f"{CONFIG} is unreadable: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointMismatchError(path, f"{CONFIG} is not a JSON object")
    return config


def weight_files(path: str) -> list[str]:
    """The safetensors files of checkpoint ``path`` (from its index when sharded)."""
    index_path = os.path.join(path, INDEX)
    if os.path.lexists(index_path):
        try:
            with open_regular(path, index_path) as f:
                weight_map = json.loads(f.read())["weight_map"]
            names = sorted(set(weight_map.values()))
        except CheckpointMismatchError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointMismatchError(path, f"{INDEX} is unreadable: {exc!r}"[:500]) from exc
        outside = [n for n in names if not _file_of(n)]
        if outside:
            raise CheckpointMismatchError(
                path, f"{INDEX} names {str(outside[0])[:200]!r}, not a file of the checkpoint "
                      "directory (a shard is a plain file name inside it)")
        missing = [n for n in names if not os.path.isfile(os.path.join(path, n))]
        if missing:
            raise CheckpointMismatchError(path, f"{INDEX} lists missing shards {missing}")
    else:
        names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not names:
        raise CheckpointMismatchError(path, "has no .safetensors weight files")
    return [os.path.join(path, n) for n in names]


def _file_of(name: object) -> bool:
    """Whether ``name`` (from an index's ``weight_map``) is a plain file name of checkpoint
    ``path``'s own directory: no directory part, no ``..``, no absolute path."""
    if not isinstance(name, str) or name in ("", ".", "..") or "\0" in name:
        return False
    return os.path.basename(name) == name and not (os.altsep and os.altsep in name)


def read_tensor_infos(path: str) -> dict[str, TensorInfo]:
    """Name -> dtype and shape of every tensor in checkpoint ``path``, from the headers.

    Raises :class:`CheckpointMismatchError` for a header that cannot be parsed or a tensor
    whose bytes lie outside its file (a truncated or corrupt shard).
    """
    infos: dict[str, TensorInfo] = {}
    for file in weight_files(path):
        infos.update(_read_header(path, file))
    return infos


def _read_header(path: str, file: str) -> dict[str, TensorInfo]:
    name = os.path.basename(file)
    with open_regular(path, file) as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointMismatchError(path, f"{name} is truncated ({size} bytes)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointMismatchError(path, f"{name} is not a safetensors file (bad header)")
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except ValueError as exc:
        raise CheckpointMismatchError(path, f"{name} has a corrupt header: {exc}") from exc
    data_bytes = size - 8 - header_len
    infos = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
            expected = math.prod(shape) * DTYPE_BYTES[dtype]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointMismatchError(path, f"{name}: tensor {key!r} has a bad entry") from exc
        if not 0 <= begin <= end <= data_bytes or end - begin != expected:
            raise CheckpointMismatchError(
                path, f"{name}: tensor {key!r} lies outside the file (truncated or corrupt)"
            )
        infos[key] = TensorInfo(dtype, shape)
    return infos


def architecture_differences(served: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """The architecture keys on which two configs disagree, as ``key: served != candidate``.

    A key one of them leaves out (or null) is not compared: a config written from a model
    built in code has no ``architectures``, and the tensor shapes are compared anyway.
    """
    return [
        f"{key}: {served[key]!r} != {candidate[key]!r}"
        for key in ARCHITECTURE_KEYS
        if served.get(key) is not None
        and candidate.get(key) is not None
        and served[key] != candidate[key]
    ]


def check_checkpoint(
    path: str,
    *,
    require_complete: bool,
    served_config: dict[str, Any] | None = None,
    served_tensors: dict[str, TensorInfo] | None = None,
) -> dict[str, TensorInfo]:
    """Check that ``path`` can replace the served weights; return its tensor infos.

    ``served_config`` / ``served_tensors`` describe the model the engine serves; each check is
    skipped when its reference is None. Raises :class:`CheckpointMismatchError` naming the
    first problem found (a FIFO, device or socket in ``path`` is one, and a tokenizer file
    that links outside it, both found before anything is opened). Blocking (reads headers);
    a few milliseconds per shard, never a wait.
    """
    if not os.path.isdir(path):
        raise CheckpointMismatchError(path, "is not a directory")
    try:
        special = special_file(path)
    except OSError as exc:
        raise CheckpointMismatchError(path, f"cannot be listed: {exc}") from exc
    if special is not None:
        raise CheckpointMismatchError(
            path, f"holds {special}; a checkpoint holds only regular files and directories")
    check_tokenizer_files(path)
    if require_complete and not os.path.isfile(os.path.join(path, COMPLETE)):
        raise CheckpointMismatchError(path, f"has no {COMPLETE} marker (still being written?)")
    if served_config is not None:
        differences = architecture_differences(served_config, read_config(path))
        if differences:
            raise CheckpointMismatchError(
                path, "architecture differs from the served model: " + "; ".join(differences)
            )
    infos = read_tensor_infos(path)
    if served_tensors is not None:
        _compare_tensors(path, served_tensors, infos)
    return infos


def _compare_tensors(
    path: str, served: dict[str, TensorInfo], candidate: dict[str, TensorInfo]
) -> None:
    missing = sorted(set(served) - set(candidate))
    extra = sorted(set(candidate) - set(served))
    if missing or extra:
        raise CheckpointMismatchError(
            path, f"tensor names differ from the served model: missing {missing[:5]}, "
            f"unexpected {extra[:5]}"
        )
    for key, info in served.items():
        if candidate[key].shape != info.shape:
            raise CheckpointMismatchError(
                path, f"tensor {key!r} has shape {list(candidate[key].shape)}, "
                f"the served model has {list(info.shape)}"
            )
