"""The weights of one point, copied to CPU at submit, and who may read them until when."""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

import torch

from actorsys._errors import WeightsReleasedError
from actorsys.snapshot import _conversions
from actorsys.snapshot._adapters.kept import KeptBase
from actorsys.snapshot._adapters.merge import assemble
from actorsys.snapshot._pool.lease import BufferLease
from actorsys.snapshot._state import Source, StatePlan, plan_state
from actorsys.snapshot._state_plan import aligned, tensor_nbytes

if TYPE_CHECKING:
    from actorsys.snapshot._sharded.plan import Handover, Sharding


class CapturedWeights:
    """A CPU copy of one point's weights, in a buffer set leased until ``release``.

    ``tensors`` are views into the leased set, in state-dict order. ``config`` and
    ``generation_config`` are copies of a transformers model's own, taken at capture (None for
    other sources); ``converter`` is the model when transformers must revert weight
    conversions on save (MoE experts fused at load), else None. ``finish(check)`` is work
    left for the writing thread before it reads ``tensors`` (merging adapters into their
    slots; ``check`` raises once the weights are released); ``on_give_back`` runs when the
    set goes back (letting go of the kept base).

    The set goes back to the pool when the point released the weights *and* no writer reads
    them (``reading``), whichever comes last, so a write thread abandoned at a timeout never
    reads memory already handed to another point: it sees ``WeightsReleasedError`` at its
    next chunk and stops.
    """

    sharding: Sharding | None = None
    """For a sharded model: ``tensors`` are this rank's shards, laid out as this says."""
    handover: Handover | None = None
    """For a sharded model on the evaluating rank: how its export meets the other ranks."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        nbytes: int,
        lease: BufferLease | None = None,
        config: Any = None,
        generation_config: Any = None,
        num_parameters: int | None = None,
        converter: torch.nn.Module | None = None,
        conversion_candidate: torch.nn.Module | None = None,
        finish: Callable[[Callable[[], None]], None] | None = None,
        on_give_back: Callable[[], None] | None = None,
    ) -> None:
        self.tensors = tensors
        self.nbytes = nbytes
        self.config = config
        self.generation_config = generation_config
        if num_parameters is None:
            num_parameters = sum(t.numel() for t in tensors.values())
        self.num_parameters = num_parameters
        self.converter = converter
        self.conversion_candidate = conversion_candidate
        self._lease = lease
        self._finish = finish
        self._on_give_back = on_give_back
        self._lock = threading.Lock()
        self._readers = 0
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """The point is done with these weights. Non-blocking, idempotent, any thread."""
        with self._lock:
            if self._released:
                return
            self._released = True
            last = self._readers == 0
        if last:
            self._give_back()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Hold the buffers for a writer. Raises ``WeightsReleasedError`` if already released."""
        with self._lock:
            if self._released:
                raise WeightsReleasedError("the weights were released before the write started")
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
                last = self._released and self._readers == 0
            if last:
                self._give_back()

    def check_live(self) -> None:
        """Raise ``WeightsReleasedError`` once the weights were released (the write is unwanted)."""
        if self._released:
            raise WeightsReleasedError("the weights were released during the write")

    def finish(self) -> None:
        """Run the work left for the writing thread (once). Blocking (the adapter merges);
        call it in the writing thread, while ``reading``."""
        finish, self._finish = self._finish, None
        if finish is not None:
            finish(self.check_live)

    def resolve_converter(self) -> torch.nn.Module | None:
        """``converter``, deciding first if capture left it open. Blocking (the first time per
        model class in a process, transformers builds its conversion table): call it in the
        writing thread."""
        candidate, self.conversion_candidate = self.conversion_candidate, None
        if candidate is not None and _conversions.resolve(candidate):
            self.converter = candidate
        return self.converter

    def _give_back(self) -> None:
        self.conversion_candidate = None
        self.tensors = {}
        self._finish = None
        if self._lease is not None:
            self._lease.give_back()
        if self._on_give_back is not None:
            self._on_give_back()


Streams = Mapping[torch.device, "torch.cuda.Stream"]


def caller_streams(plan: StatePlan) -> dict[torch.device, torch.cuda.Stream]:
    """The calling thread's current CUDA stream on each device ``plan``'s tensors are on, for
    a copy that runs in another thread (``capture(..., streams=)``): a new thread's current
    stream is the default one, not the trainer's. Empty on CPU, where it touches no CUDA
    API. Non-blocking."""
    if not plan.on_cuda:
        return {}
    devices = {t.device for t in plan.entries.values() if t.device.type == "cuda"}
    return {device: torch.cuda.current_stream(device) for device in devices}


def capture(
    source: Source,
    *,
    buffers: BufferLease | None = None,
    plan: StatePlan | None = None,
    streams: Streams | None = None,
) -> CapturedWeights:
    """Copy ``source``'s tensors into CPU memory the pipeline owns.

    Blocks the calling thread for one copy of the weights (of a peft model: of what trains, plus
    the frozen tensors that changed since the pool kept them, all of them the first time);
    afterwards the caller may change them freely. With ``buffers`` (a lease from the
    supervisor's pool) the copy goes into reused memory (waiting for it if the pool is still
    faulting it in); without, into fresh memory. Per-class metadata transformers is slow to
    compute is only looked up here, never computed (see ``_conversions``). Tensors on CUDA are
    copied asynchronously into the (pinned) set, then each CUDA device's current stream is
    synchronised once (``streams``, from :func:`caller_streams`: the streams of the thread that
    handed the weights over, for a copy in a worker thread). Raises ``TypeError`` /
    ``ValueError`` naming an entry that cannot be written,
    :class:`~actorsys.UnsupportedModelError` for a model whose form cannot be copied; the lease
    is given back on any error. ``plan`` is ``plan_state(source)`` if the caller made it already
    (admission sizes the lease from it), so a submit plans once; the tensors it names are read
    when the copy runs.
    """
    if plan is None:
        plan = plan_state(source)
    lease = buffers if buffers is not None else BufferLease(plan.buffer_nbytes, pinned=plan.on_cuda)
    let_go: Callable[[], None] | None = None
    try:
        if plan.buffer_nbytes > lease.nbytes:
            raise ValueError(
                f"the weights need {plan.buffer_nbytes} bytes of buffer, the lease holds "
                f"{lease.nbytes}; did the model change between reserve and capture?"
            )
        tensors = _copy_into(plan, lease, streams) if plan.entries else {}
        lease.prepare_spares()
        if plan.adapters is None:
            weights = CapturedWeights(tensors, nbytes=plan.nbytes, lease=lease)
        else:
            kept = lease.pool.kept if lease.pool is not None else KeptBase()
            outputs, merge, let_go = assemble(plan.adapters, tensors, lease.buffer(), kept)
            weights = CapturedWeights(
                outputs, nbytes=plan.nbytes, lease=lease, finish=merge, on_give_back=let_go,
                num_parameters=plan.adapters.num_parameters,
            )
        weights.sharding = plan.sharding
        if plan.model is not None:
            adapters = plan.adapters
            _capture_model_files(
                plan, weights, count_parameters=adapters is None,
                structure=None if adapters is None else adapters.structure,
            )
    except BaseException:
        lease.give_back()
        if let_go is not None:
            let_go()
        raise
    return weights


def capture_shards(plan: StatePlan, lease: BufferLease) -> CapturedWeights:
    """On a rank that only contributes its shards: copy ``plan``'s local shards into
    ``lease`` (blocking for the copy), without the model files the evaluating rank takes
    (config, generation config), which a contributor never writes. Gives the lease back on
    any error."""
    try:
        if plan.buffer_nbytes > lease.nbytes:
            raise ValueError(
                f"the shards need {plan.buffer_nbytes} bytes of buffer, the lease holds {lease.nbytes}"
            )
        tensors = _copy_into(plan, lease) if plan.entries else {}
        lease.prepare_spares()
        weights = CapturedWeights(tensors, nbytes=plan.nbytes, lease=lease)
        weights.sharding = plan.sharding
    except BaseException:
        lease.give_back()
        raise
    return weights


def _copy_into(
    plan: StatePlan, lease: BufferLease, given: Streams | None = None
) -> dict[str, torch.Tensor]:
    """Copy ``plan``'s entries into ``lease``'s set; their views there, by name. A CUDA
    tensor is copied on ``given``'s stream for its device, else on the current one.

    The views are laid out once per plan and set: a plan recalled unchanged (``_plans``)
    keeps its ``memo``, which stands for its layout. An adapter plan's entries vary between
    points (the frozen tensors that changed), so its views are made each time."""
    entries = plan.entries
    layout = plan.memo if plan.adapters is None else None
    targets = lease.views(layout, functools.partial(_lay_out, entries))
    streams: dict[torch.device, torch.cuda.Stream] = dict(given or {})
    try:
        with torch.no_grad(), ExitStack() as on_given:
            for stream in streams.values():
                on_given.enter_context(torch.cuda.stream(stream))
            on_cpu: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
            for name, source in entries.items():
                if source.device.type != "cuda":
                    on_cpu[0].append(targets[name])
                    on_cpu[1].append(source)
                    continue
                if source.device not in streams:
                    streams[source.device] = torch.cuda.current_stream(source.device)
                targets[name].copy_(source, non_blocking=True)
            if on_cpu[0]:
                # One call for every CPU tensor: it takes the GIL back once, not once a tensor
                # (a copy in a worker thread beside a busy trio thread waited a switch
                # interval for the GIL between tensors).
                torch._foreach_copy_(*on_cpu)
    finally:
        # Also on error: no copy may still be landing in the buffer once it is given back.
        for stream in streams.values():
            stream.synchronize()
    return dict(targets)


def _lay_out(entries: dict[str, torch.Tensor], buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of ``buffer`` shaped as ``entries``, one after another at aligned offsets."""
    views: dict[str, torch.Tensor] = {}
    offset = 0
    for name, source in entries.items():
        nbytes = tensor_nbytes(source)
        views[name] = buffer[offset : offset + nbytes].view(source.dtype).view(source.shape)
        offset += aligned(nbytes)
    return views


def _capture_model_files(
    plan: StatePlan,
    weights: CapturedWeights,
    *,
    count_parameters: bool = True,
    structure: _conversions.Structure | None = None,
) -> None:
    """What ``save_pretrained`` writes besides the weights, as of now: the model's config
    (with its dtype and architecture, as ``save_pretrained`` sets them) and generation
    config, how to revert weight conversions (``structure``: the model's, if its plan knows
    it), and (``count_parameters``) the model's own parameter count (a peft model's counts its
    adapters, which the merged model has not). The count and the conversions follow from the
    model's structure: they are looked up once per plan (``plan.memo``)."""
    model = plan.model
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(config, "save_pretrained", None)):
        return
    config = copy.deepcopy(config)
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype):
        config.dtype = str(dtype).removeprefix("torch.")
    config.architectures = [type(model).__name__.removeprefix("FSDP")]
    weights.config = config
    can_generate = getattr(model, "can_generate", None)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and callable(can_generate) and can_generate():
        weights.generation_config = copy.deepcopy(generation_config)
    memo = plan.memo
    num_parameters = getattr(model, "num_parameters", None)
    if count_parameters and callable(num_parameters):
        if "num_parameters" not in memo:
            memo["num_parameters"] = int(num_parameters())
        weights.num_parameters = memo["num_parameters"]
    has_conversions = memo.get("conversions")
    if has_conversions is None:
        has_conversions = memo["conversions"] = _conversions.known(model, structure)
    if has_conversions is None:
        del memo["conversions"]
        weights.conversion_candidate = model
    elif has_conversions:
        weights.converter = model
