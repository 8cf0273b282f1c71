import pytest

from actorsys import ConfigError, EvalConfig


def test_defaults_match_the_contract() -> None:
    config = EvalConfig()
    assert (config.max_in_flight, config.overflow, config.keep_snapshots) == (2, "backpressure", 2)
    assert (config.pin_timeout, config.pin_retries, config.close_timeout) == (600.0, 2, 30.0)
    assert (config.max_restarts, config.restart_period) == (3, 60.0)
    assert config.export_timeout is None and config.eval_timeout is None
    assert config.probe is True


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("overflow", "drop", "backpressure, skip, latest"),
        ("max_in_flight", 0, ">= 1"),
        ("max_in_flight", True, ">= 1"),
        ("keep_snapshots", -1, ">= 0"),
        ("pin_retries", 1.5, ">= 0"),
        ("max_restarts", -2, ">= 0"),
        ("pin_timeout", 0, "> 0"),
        ("close_timeout", float("inf"), "> 0"),
        ("eval_timeout", -1.0, "or None"),
        ("export_timeout", "10", "or None"),
        ("restart_period", None, "> 0"),
        ("save_hf", "/ckpt/hf", "{step}"),
        ("hf_dir", 42, "path"),
        ("probe", "yes", "True or False"),
    ],
)
def test_bad_value_names_the_field_and_what_it_accepts(field: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as caught:
        EvalConfig(**{field: value})  # type: ignore[arg-type]
    assert caught.value.field == field
    assert field in str(caught.value) and allowed in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_reuse_path_formats_the_step() -> None:
    assert EvalConfig(save_hf="/ckpt/hf/{step}").reuse_path(7) == "/ckpt/hf/7"
    assert EvalConfig().reuse_path(7) is None


def test_config_is_frozen() -> None:
    config = EvalConfig()
    with pytest.raises(AttributeError):
        config.max_in_flight = 3  # type: ignore[misc]
