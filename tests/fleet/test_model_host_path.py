"""The embedded engine reads its model from a local directory only: a missing one is a clear
error naming the path, and nothing asks a model hub for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actorsys import ConfigError
from actorsys.fleet.embedded import model


def test_a_missing_model_directory_is_a_config_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def looked_up(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"transformers was asked for {args!r}")

    monkeypatch.setattr(model, "load_tokenizer", looked_up)
    monkeypatch.setattr(model, "load_causal_lm", looked_up)
    missing = tmp_path / "org" / "no-model"
    with pytest.raises(ConfigError, match=f"no model directory at {missing}"):
        model.ModelHost(str(missing))
