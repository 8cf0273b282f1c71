"""EvalCallback inside a real Lightning run (CPU): the transformers model inside the
LightningModule is what each point exports (its own keys), and the trainer's logger gets the
eval metrics at the steps the weights came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import Logger  # noqa: E402

from actorsys import ConfigError, EvalConfig, MemorySink  # noqa: E402
from actorsys.integrations.lightning import EvalCallback  # noqa: E402
from tests.integrations.trainer_models import KeepsSnapshots, base_model, token_rows  # noqa: E402

pytestmark = pytest.mark.slow


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))


class LitLM(pl.LightningModule):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=5e-3)


def loader() -> torch.utils.data.DataLoader[Any]:
    rows = [{k: torch.tensor(v) for k, v in row.items()} for row in token_rows()]
    return torch.utils.data.DataLoader(rows, batch_size=4)  # type: ignore[arg-type]


def trainer(steps: int, logger: Logger, callback: EvalCallback) -> pl.Trainer:
    return pl.Trainer(
        max_steps=steps, accelerator="cpu", devices=1, logger=logger, callbacks=[callback],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        log_every_n_steps=5,
    )


@pytest.mark.timeout(240)
def test_the_logger_gets_eval_metrics_at_steps_ten_and_twenty(tmp_path: Path) -> None:
    model = base_model(tmp_path / "base")
    eval_fn, sink, logger = KeepsSnapshots(), MemorySink(), RecordingLogger()
    config = EvalConfig(hf_dir=tmp_path / "staging", base_checkpoint=tmp_path / "base")
    callback = EvalCallback(config, eval_fn=eval_fn, every=10, sink=sink)
    trainer(20, logger, callback).fit(LitLM(model), loader())

    assert sorted((o.step, o.status) for o in sink.outcomes) == [(10, "ok"), (20, "ok")]
    eval_logged = {step: row for step, row in logger.logged if "eval/step" in row}
    assert sorted(eval_logged) == [10, 20]
    assert all(row["eval/step"] == step and "eval/mean_square" in row
               for step, row in eval_logged.items())
    assert set(eval_fn.tensors[20]) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert eval_fn.tensors[20][name].equal(tensor)


def test_a_module_without_a_transformers_model_is_a_config_error(tmp_path: Path) -> None:
    callback = EvalCallback(EvalConfig(hf_dir=tmp_path / "staging"), eval_fn=KeepsSnapshots(),
                            every=10, model_attr="net")
    with pytest.raises(ConfigError, match="model_attr"):
        callback.exported_model(LitLM(torch.nn.Linear(2, 2)))
