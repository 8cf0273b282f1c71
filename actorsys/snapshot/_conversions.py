"""Whether ``save_pretrained`` would revert weight conversions for a model, cached per class.

transformers decides it from per-class metadata: the first lookup in a process builds its
table of conversions (about 900 regexes, 0.2-0.5 s), so the question must never be asked on
the trainer's thread. ``known`` answers at once from what is already known (the conversions a
loaded model carries, or the cache); ``resolve`` computes and caches the answer, in whichever
thread can afford it (a preparation, or the export thread that needs it).
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
Structure = tuple[tuple[type, object], ...]
_by_structure: dict[Structure, bool] = {}


def known(model: Any, key: Structure | None = None) -> bool | None:
    """The answer if it costs nothing now, else None. Never blocks on transformers.
    ``key`` is ``structure(model)`` if the caller knows it already (a walk over the modules
    saved)."""
    conversions = getattr(model, "_weight_conversions", None)
    if conversions is not None:
        return bool(conversions)
    if key is None:
        key = structure(model)
    if key is None:
        return False
    with _lock:
        return _by_structure.get(key)


def resolve(model: Any) -> bool:
    """The answer, computed (slow the first time in a process) and cached by the classes and
    model types of the model's transformers sub-models, which are what transformers' lookup
    reads. The check is the one ``revert_weight_conversion`` starts with."""
    answer = known(model)
    if answer is not None:
        return answer
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange
    except ImportError:
        return False
    conversions = [
        c for c in get_model_conversion_mapping(model, add_legacy=False)
        if not isinstance(c, PrefixChange)
    ]
    key = structure(model)
    if key is not None:
        with _lock:
            _by_structure[key] = bool(conversions)
    return bool(conversions)


def forget() -> None:
    """Empty the cache (for tests)."""
    with _lock:
        _by_structure.clear()


def structure(model: Any) -> Structure | None:
    """What the answer for ``model`` depends on (one walk over its modules): the classes and
    model types of its transformers sub-models; None for a model that is not one."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    if not isinstance(model, PreTrainedModel):
        return None
    return tuple(
        (type(module), getattr(module.config, "model_type", None))
        for module in model.modules()
        if isinstance(module, PreTrainedModel)
    )
