"""Fixtures of the v1 endpoints' tests."""

from __future__ import annotations

import pytest

from service.operations import analyses, census


@pytest.fixture
def never_computed(monkeypatch):
    """The engine call of an explain or census request fails the test: what is refused is refused before
    computing."""
    class Computed:
        def __init__(self, *args, **kwargs):
            raise AssertionError("computed a request that its limits refuse")

    for operation in (analyses, census):
        monkeypatch.setattr(operation, "EngineCall", Computed)
