import bridge


def test_all_is_pinned() -> None:
    assert set(bridge.__all__) == {"AsyncEvalBridge", "EvalBridge", "TRIO_THREAD"}


def test_every_public_name_is_importable() -> None:
    for name in bridge.__all__:
        assert getattr(bridge, name) is not None
