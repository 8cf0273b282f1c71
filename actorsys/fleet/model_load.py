"""Loading a checkpoint with transformers inside a process that may be a trainer's.

``from_pretrained`` (transformers 5) swaps process-wide state while it loads: it replaces
``PreTrainedModel.tie_weights`` with a no-op and sets torch's default dtype, and puts both
back at the end. Two loads that overlap in different threads can therefore leave the no-op in
place for good (the second saved the first's no-op as "the original"): every model built in
the process afterwards, the trainer's included, has untied embeddings. Every load actorsys
makes in-process (the weight probe's reference, the embedded engine) goes through
:func:`load_causal_lm`, which never overlaps another of ours. A load by the host's own code
in another thread at the same moment is not covered: that is transformers' hazard.
"""

from __future__ import annotations

import threading
from typing import Any

_LOADS = threading.Lock()


def load_causal_lm(path: str, **kwargs: Any) -> Any:
    """``AutoModelForCausalLM.from_pretrained(path, **kwargs)``, one such load of ours at a
    time in this process. Blocking: call it in a worker thread."""
    from transformers import AutoModelForCausalLM

    with _LOADS:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
