"""The lifecycle the servers' apps share (``shoal.serving.loading.LoadingApp``): a model that
loads makes the app ready and tells ``on_ready``; one that raises fails the app with a
``ModelLoadError`` naming what it raised (``/ping``'s 503 says it) and tells
``on_load_error``; one still loading at the load timeout fails naming the key, and what it
returns later is discarded, not served. Driven on a real event loop and loading thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from shoal.errors import ModelLoadError
from shoal.serving.loading import LoadingApp, ModelState


class _App(LoadingApp[str]):
    def __init__(self, load: Any, **kwargs: Any) -> None:
        self.errors: list[BaseException] = []
        super().__init__(api_key=None, on_load_error=self.errors.append, **kwargs)
        self._load_fn = load
        self.served: list[tuple[str, float]] = []
        self.discarded: list[str] = []

    def load(self) -> str:
        return str(self._load_fn())

    def became_ready(self, loaded: str, seconds: float) -> None:
        self.served.append((loaded, seconds))

    def discard(self, loaded: str) -> None:
        self.discarded.append(loaded)

    async def _http(self, scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not used")

    async def on_shutdown(self) -> None:
        pass


async def _until(check: Any, what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def test_a_model_that_loads_makes_the_app_ready():
    app = _App(lambda: "model")
    told: list[bool] = []
    app.on_ready = lambda: told.append(True)

    async def scenario() -> None:
        assert app.not_ready().error == "model loading"
        app.on_startup(asyncio.get_running_loop())
        await _until(lambda: app.state is not ModelState.LOADING, "the load")

    asyncio.run(scenario())
    assert app.state is ModelState.READY
    assert [s[0] for s in app.served] == ["model"] and told == [True] and not app.errors


def test_a_load_that_raises_fails_the_app_saying_what_it_raised():
    def load() -> str:
        raise ValueError("weights.bin is truncated")

    app = _App(load)

    async def scenario() -> None:
        app.on_startup(asyncio.get_running_loop())
        await _until(lambda: app.state is not ModelState.LOADING, "the failure")

    asyncio.run(scenario())
    assert app.state is ModelState.FAILED and not app.served
    (error,) = app.errors
    assert isinstance(error, ModelLoadError) and error is app.load_error
    assert "ValueError: weights.bin is truncated" in str(error)
    refusal = app.not_ready()
    assert refusal.status == 503 and refusal.error == "model failed to load"
    assert "weights.bin is truncated" in refusal.detail


@pytest.mark.parametrize("listen_when_loaded", [False, True])
def test_a_load_past_its_timeout_fails_and_a_late_model_is_discarded(listen_when_loaded):
    release = threading.Event()
    app = _App(lambda: "late" if release.wait(30) else "never", load_timeout_s=0.05)
    app.listen_when_loaded = listen_when_loaded

    async def scenario() -> None:
        app.on_startup(asyncio.get_running_loop())
        await asyncio.wait_for(app.started(), 10)  # returns once loaded or failed
        await _until(lambda: app.state is ModelState.FAILED, "the load timeout")
        release.set()
        await _until(lambda: app.discarded, "the late model to be discarded")

    asyncio.run(scenario())
    (error,) = app.errors
    assert isinstance(error, ModelLoadError)
    assert error.details["key"] == "option.model_loading_timeout"
    assert "option.model_loading_timeout=0.05 s" in str(error)
    assert app.discarded == ["late"] and not app.served and app.state is ModelState.FAILED
