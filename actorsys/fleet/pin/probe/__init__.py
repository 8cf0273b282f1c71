"""The weight probe: after a pin, every engine must compute what the snapshot computes.

A version read back is a label, not proof: vLLM's in-place reload of a model with tied
embeddings labels the new version while it serves the new body with the old head, and of an
MoE model, while it serves experts packed from the previous weights (see
``actorsys/fleet/vllm_worker``). So, once every engine reads back the version, each answers a
short fixed probe, compared with what the snapshot itself computes (transformers, in a
worker process).

The probe is one prefill where the engine can answer it (:class:`PrefillEngine`: the CPU
engine and vLLM, through completions with ``echo`` and ``logprobs``): the log-probabilities
of ``PREFILL_SEQUENCES`` fixed sequences (:func:`prefill_sequences`: ``PROMPT_TOKENS``
prompt token ids and ``PROBE_TOKENS`` fixed continuation tokens), one small forward pass and
no decoding, asked in one request per engine once the version reads back. Each
position may differ from the snapshot's by its margin (below); the answer is wrong where the
median difference over all positions exceeds it, which numerics never reach and other weights
always do. Engines that cannot answer a prefill answer ``PROBE_TOKENS`` greedy tokens after
each prompt (penalties off), compared with the snapshot's greedy continuation as follows.

Kernel numerics differ between engines and dtypes, so a token counts as wrong only where the
snapshot clearly prefers its own choice: the engine's token must be within ``margin`` of the
snapshot's best at that position, ``margin = REL_MARGIN * std(logits) + ABS_MARGIN`` of the
snapshot's logits there (``HALF_PRECISION_REL_MARGIN`` instead of ``REL_MARGIN`` for a
snapshot in a 16-bit dtype: the tolerance follows the precision the weights carry).
Where an engine takes another token within the margin (a near-tie)
the two continuations part ways and the rest of that prompt is not compared. Weights that
are not the snapshot's pick tokens the snapshot puts several standard deviations below its
best, at almost every position.

The reference is computed out of the pinning process, by a reference worker
(:mod:`actorsys.fleet.pin.reference`): the trainer's process never maps the snapshot, never runs
its forward and never swaps transformers' process-wide state for it. The worker maps the
snapshot's safetensors files and computes on the mapped pages. It runs one reference at a
time, started once the engines read the version back (beside their loads it would take the
cores they load with), so it overlaps the evaluation instead, off the pin's critical path: the
probe's prompts need only the snapshot's ``config.json`` (read beside the loads), so the
engines answer them as soon as they read the version back, and the answers are judged
against the reference when it is ready (see :meth:`actorsys.Fleet.pin_and_verify`). The evaluation does
not wait for either: it starts at the read-back, and its point settles only after the
verdict. A reference that
fails (the worker crashed or ran out of memory) leaves that pin checked by version only, says
so on its verdict (``PinVerdict.unverified``, and so on the point's data), and the next pin
asks again: a failure never turns the probe off.

A shared fleet (the trainer's own engines, :meth:`actorsys.Fleet.pin_served`) has no
snapshot to compute a reference from: its engines are judged by each other
(:mod:`actorsys.fleet.pin.probe.agreement`).

An engine that cannot answer a probe (no ``greedy_tokens``, as an in-process ``Engine`` that
implements just the protocol; or a server without the endpoint), or a snapshot without a
``config.json``, is checked by its version only, and the fleet logs why once.
"""

from actorsys.fleet.pin.probe.asking import (
    PrefillEngine,
    ProbedEngine,
    ProbeUnsupportedError,
    WeightProbe,
)
from actorsys.fleet.pin.probe.compare import (
    Answer,
    PrefillAnswer,
    WeightsMismatchError,
    first_disagreement,
    judge,
    prefill_disagreement,
)
from actorsys.fleet.pin.probe.prompts import (
    ABS_MARGIN,
    HALF_PRECISION_REL_MARGIN,
    PREFILL_SEQUENCES,
    PROBE_PROMPTS,
    PROBE_SAMPLING,
    PROBE_SEED,
    PROBE_TOKENS,
    PROMPT_TOKENS,
    REL_MARGIN,
    ReferenceUnavailableError,
    prefill_sequences,
    probe_prompts,
    probe_sequence,
    read_probe_prompts,
)
from actorsys.fleet.pin.probe.reference_answer import (
    NEAR_CAP,
    NEAR_TOKENS,
    Reference,
    ReferenceFailedError,
    ReferenceSource,
    compute_reference,
    reference_from_logits,
)

__all__ = [
    "ABS_MARGIN",
    "HALF_PRECISION_REL_MARGIN",
    "NEAR_CAP",
    "NEAR_TOKENS",
    "PREFILL_SEQUENCES",
    "PROBE_PROMPTS",
    "PROBE_SAMPLING",
    "PROBE_SEED",
    "PROBE_TOKENS",
    "PROMPT_TOKENS",
    "REL_MARGIN",
    "Answer",
    "PrefillAnswer",
    "PrefillEngine",
    "ProbeUnsupportedError",
    "ProbedEngine",
    "Reference",
    "ReferenceFailedError",
    "ReferenceSource",
    "ReferenceUnavailableError",
    "WeightProbe",
    "WeightsMismatchError",
    "compute_reference",
    "first_disagreement",
    "judge",
    "prefill_disagreement",
    "prefill_sequences",
    "probe_prompts",
    "probe_sequence",
    "read_probe_prompts",
    "reference_from_logits",
]
