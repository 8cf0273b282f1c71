"""The demo's output directory: it deletes or overwrites only what an earlier demo made there.

``DIR/.actorsys-demo.json`` lists what the demo makes in DIR (written before any of it). A
path the demo would write that exists and is not listed there (a user's ``base/``, a
``metrics.jsonl`` of another tool) stops the demo before it touches anything.
"""

from __future__ import annotations

import json
import os

from actorsys._errors import ConfigError
from actorsys.staging import discard

MANIFEST = ".actorsys-demo.json"
MADE = ("base", "staging", "logs", "metrics.jsonl", "held_out.jsonl", "eval.png")
"""What a demo run makes in its output directory."""
CLEARED = ("base", "staging", "metrics.jsonl")
"""What a new run deletes first (an earlier run's checkpoint, snapshots and rows)."""


def out_problem(out: str) -> str | None:
    """Why the demo may not write into ``out``, or None. Blocking (reads ``out``)."""
    if os.path.lexists(out) and not os.path.isdir(out):
        return f"{out} exists and is not a directory; pass a directory"
    made = _made_before(out)
    for name in MADE:
        path = os.path.join(out, name)
        if os.path.lexists(path) and name not in made:
            return (f"{path} exists and was not made by actorsys demo (not listed in "
                    f"{os.path.join(out, MANIFEST)}); pass another --out or move it away")
    return None


def prepare_out(out: str) -> None:
    """Make ``out`` ready for a run: record what the demo makes there, then delete what an
    earlier demo made that a run replaces. Raises :class:`ConfigError` (field ``out``) and
    changes nothing where :func:`out_problem` finds a problem. Blocking."""
    problem = out_problem(out)
    if problem is not None:
        raise ConfigError("out", problem)
    try:
        os.makedirs(out, exist_ok=True)
        manifest = os.path.join(out, MANIFEST)
        tmp = f"{manifest}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"made_by": "actorsys demo", "paths": list(MADE)}, f)
        os.replace(tmp, manifest)
    except OSError as exc:
        raise ConfigError("out", f"cannot write into {out} ({exc.strerror or exc}); pass a "
                                 "directory you can write") from exc
    for name in CLEARED:
        path = os.path.join(out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            discard(path)
        elif os.path.lexists(path):
            os.unlink(path)


def _made_before(out: str) -> set[str]:
    try:
        with open(os.path.join(out, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return set()
    paths = manifest.get("paths") if isinstance(manifest, dict) else None
    return {name for name in paths if name in MADE} if isinstance(paths, list) else set()
