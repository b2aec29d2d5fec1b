"""service/__init__.py: the app factory and its Flask subclass."""

from __future__ import annotations

from service.edge import App, create_app


def test_the_factory_builds_the_services_flask_subclass():
    assert isinstance(create_app({"TESTING": True}), App)


def test_sync_functions_are_used_as_they_are_and_coroutine_functions_still_go_to_async_to_sync(monkeypatch):
    app = create_app({"TESTING": True})

    def view() -> str:
        return "sync"

    async def coroutine() -> str:
        return "async"

    assert app.ensure_sync(view) is view
    assert app.ensure_sync(view) is view  # asked again: the cached answer
    handed = []
    monkeypatch.setattr(app, "async_to_sync", lambda func: handed.append(func) or "wrapped")
    assert app.ensure_sync(coroutine) == "wrapped" and handed == [coroutine]
