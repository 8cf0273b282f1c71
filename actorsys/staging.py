"""The staging directory: where exports are written, published and retired.

Every directory actorsys creates carries a ``.actorsys`` marker file. A snapshot is written
into ``.tmp-step_<N>-<id>``, made durable (fsync), marked ``.complete`` and then renamed to
``step_<N>`` in one atomic step, so a reader never sees a half-written ``step_<N>``. Retiring
renames back to a ``.tmp-`` name before deleting, so an interrupted delete is swept at the next
start. The sweep only ever removes marked ``.tmp-`` directories directly inside the staging
dir, and never follows a symlink.

Every function here blocks on the file system; the actors run the slow ones (writing and
sealing a snapshot, retiring, discarding) through :func:`actorsys.runtime.run_blocking`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

from actorsys._errors import ConfigError
from actorsys._files import fsync_directory

MARKER = ".actorsys"
COMPLETE = ".complete"
TMP_PREFIX = ".tmp-"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def prepare_staging_dir(path: str) -> str:
    """Create ``path`` if needed and check it is a writable directory; return it absolute."""
    path = os.path.abspath(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ConfigError("hf_dir", f"{path} exists and is not a directory; pass a directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=TMP_PREFIX + "probe-"):
            pass
    except OSError as exc:
        raise ConfigError(
            "hf_dir", f"{path} is not writable ({exc.strerror}); pass a directory you can write"
        ) from exc
    return path


def final_dir(staging: str, step: int) -> str:
    return os.path.join(staging, f"step_{step}")


def tmp_path(staging: str, step: int) -> str:
    """A fresh name for the tmp directory of the export of ``step`` (nothing is created)."""
    return os.path.join(staging, f"{TMP_PREFIX}step_{step}-{uuid.uuid4().hex[:12]}")


def make_tmp_dir(path: str, *, durable: bool = True) -> str:
    """Create the marked tmp directory ``path``; return it. Without ``durable`` the marker is
    not fsync'd here (``seal`` makes it durable with the rest: only a power loss before the
    seal can lose it, and the sweep then leaves that directory alone)."""
    os.mkdir(path)
    _write_file(os.path.join(path, MARKER), b"", durable=durable)
    return path


def new_tmp_dir(staging: str, step: int) -> str:
    """Create a fresh, marked tmp directory for the export of ``step``."""
    return make_tmp_dir(tmp_path(staging, step))


def seal(tmp: str) -> None:
    """Mark ``tmp`` complete and make it durable (fsync): ready to ``install``."""
    _write_file(os.path.join(tmp, COMPLETE), b"")
    fsync_directory(tmp)


def install(tmp: str, final: str) -> None:
    """Rename a sealed ``tmp`` to ``final`` atomically and make the rename durable.

    A stale ``final`` from an earlier run is replaced only if actorsys created it.
    """
    if os.path.lexists(final):
        if not is_ours(final):
            raise FileExistsError(f"{final} exists and was not created by actorsys")
        retire(final)
    os.rename(tmp, final)
    fsync_directory(os.path.dirname(final))


def is_ours(path: str) -> bool:
    return (
        os.path.isdir(path)
        and not os.path.islink(path)
        and os.path.isfile(os.path.join(path, MARKER))
    )


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, COMPLETE))


def has_weights(path: str) -> bool:
    return any(name.endswith(WEIGHT_SUFFIXES) for name in os.listdir(path))


def discard(path: str) -> None:
    """Remove a directory actorsys created (or a symlink in its place); missing is fine."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def retire(path: str) -> None:
    """Delete a published snapshot: rename it out of the way, then remove it."""
    if not os.path.lexists(path):
        return
    parent, name = os.path.split(path)
    doomed = os.path.join(parent, f"{TMP_PREFIX}retired-{name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, doomed)
    except OSError:
        doomed = path
    discard(doomed)


def sweep(staging: str) -> list[str]:
    """Remove the marked tmp directories an earlier run left in ``staging``; return them."""
    removed = []
    with os.scandir(staging) as entries:
        for entry in entries:
            if not entry.name.startswith(TMP_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            if is_ours(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def tmp_dirs(staging: str) -> list[str]:
    """The tmp directories in ``staging`` now (for tests and statistics)."""
    return sorted(e for e in os.listdir(staging) if e.startswith(TMP_PREFIX))


def _write_file(path: str, data: bytes, *, durable: bool = True) -> None:
    with open(path, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())


def free_bytes(path: str) -> int:
    return shutil.disk_usage(path).free
