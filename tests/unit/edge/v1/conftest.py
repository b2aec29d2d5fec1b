"""Fixtures of the v1 endpoints' tests."""

from __future__ import annotations

import pytest

from service.operations import analyses


@pytest.fixture
def never_computed(monkeypatch):
    """The engine call of an explain request fails the test: what is refused is refused before computing."""
    class Computed:
        def __init__(self, *args, **kwargs):
            raise AssertionError("computed a request that its limits refuse")

    monkeypatch.setattr(analyses, "EngineCall", Computed)
