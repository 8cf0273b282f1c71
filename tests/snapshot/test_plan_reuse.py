"""A second plan of the same model reuses the first while the model is unchanged, and any change
that alters what a snapshot holds (a parameter replaced or resized, a buffer or module added, a
dtype cast) gets a new plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from actorsys.snapshot import _plan_cache as _plans
from actorsys.snapshot import _state, capture, plan_state
from tests.snapshot.snapshot_models import tiny_llama


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[torch.nn.Module]:
    """The models ``plan_state`` planned from scratch (each a walk over the modules)."""
    planned: list[torch.nn.Module] = []
    real = _state.model_form

    def counting(module: torch.nn.Module) -> Any:
        planned.append(module)
        return real(module)

    monkeypatch.setattr(_state, "model_form", counting)
    return planned


def test_a_second_plan_of_an_unchanged_model_reuses_the_first(walks: list[torch.nn.Module]) -> None:
    model = tiny_llama(tied=False)
    first = plan_state(model)
    second = plan_state(model)

    assert walks == [model]
    assert second.model is model and second.memo is first.memo
    assert list(second.entries) == list(first.entries)
    assert (second.nbytes, second.buffer_nbytes) == (first.nbytes, first.buffer_nbytes)
    assert all(
        a.data_ptr() == b.data_ptr() and a.shape == b.shape
        for a, b in zip(first.entries.values(), second.entries.values(), strict=True)
    )


def test_a_reused_plan_copies_the_weights_as_they_are_at_capture() -> None:
    model = tiny_llama(tied=False)
    capture(model).release()
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    weights = capture(model)
    try:
        assert torch.equal(weights.tensors["lm_head.weight"], model.lm_head.weight)
        assert weights.num_parameters == model.num_parameters()
    finally:
        weights.release()


def _replace(model: torch.nn.Module) -> None:
    old = model.lm_head.weight
    model.lm_head.weight = torch.nn.Parameter(old.detach().clone())


def _resize(model: torch.nn.Module) -> None:
    old = model.lm_head.weight
    old.data = torch.zeros(old.shape[0] + 1, old.shape[1])


def _add_buffer(model: torch.nn.Module) -> None:
    model.lm_head.register_buffer("scale", torch.ones(3))


def _add_module(model: torch.nn.Module) -> None:
    model.extra = torch.nn.Linear(2, 2)


def _cast(model: torch.nn.Module) -> None:
    model.to(torch.bfloat16)


def _non_persistent(model: torch.nn.Module) -> None:
    buffers = model.model.rotary_emb._non_persistent_buffers_set
    buffers.discard("inv_freq")


CHANGES: dict[str, Callable[[torch.nn.Module], None]] = {
    "replaced": _replace, "resized": _resize, "buffer": _add_buffer, "module": _add_module,
    "cast": _cast, "non-persistent": _non_persistent,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_model_gets_a_new_plan(walks: list[torch.nn.Module], change: str) -> None:
    model = tiny_llama(tied=False)
    first = plan_state(model)
    CHANGES[change](model)
    second = plan_state(model)
    expected = {name: t.detach() for name, t in model.state_dict().items()}

    assert walks == [model, model]
    assert list(second.entries) == list(expected)
    for name, tensor in second.entries.items():
        assert tensor.data_ptr() == expected[name].data_ptr(), name
        assert tensor.dtype == expected[name].dtype and tensor.shape == expected[name].shape
    if change in ("resized", "buffer", "module", "cast"):
        assert second.nbytes != first.nbytes
    assert plan_state(model).entries.keys() == second.entries.keys()
    assert walks == [model, model]


def test_a_model_let_go_is_not_kept_alive() -> None:
    import gc
    import weakref

    model = tiny_llama(tied=False)
    plan_state(model)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


def test_a_model_with_a_state_dict_post_hook_is_planned_each_time(walks: list[torch.nn.Module]) -> None:
    model = tiny_llama(tied=False)
    model.lm_head.register_state_dict_post_hook(lambda *args: None)
    plan_state(model)
    plan_state(model)
    assert walks == [model, model]
    _plans.forget(model)
