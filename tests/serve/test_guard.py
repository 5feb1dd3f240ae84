"""The serve guard (runtime.serve.app._Guard) on its own, no bundle: every API request is counted once, with the
status its reply started with, or 499 / 500 when the app was cancelled (Ray cancels a request whose client left) or
failed before replying."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from runtime.serve.app import _Guard
from runtime.serve.config import ServeConfig


def _guarded(app):
    counted = []

    def labels(path, status):
        return SimpleNamespace(inc=lambda: counted.append((path, status)))

    served = SimpleNamespace(state=SimpleNamespace(metrics=SimpleNamespace(requests=SimpleNamespace(labels=labels))))
    return _Guard(app, served=served, config=ServeConfig(bundle=Path("unused"))), counted


def _call(guard):
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b""}

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    asyncio.run(guard(scope, receive, send))


async def _replies(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _cancelled(scope, receive, send):
    raise asyncio.CancelledError


async def _fails(scope, receive, send):
    raise RuntimeError("boom")


def test_a_reply_is_counted_with_its_status():
    guard, counted = _guarded(_replies)
    _call(guard)
    assert counted == [("/v1/chat/completions", "200")]


@pytest.mark.parametrize(
    ("app", "error", "status"), [(_cancelled, asyncio.CancelledError, "499"), (_fails, RuntimeError, "500")]
)
def test_a_request_that_ends_without_a_reply_is_counted_and_the_error_goes_on(app, error, status):
    guard, counted = _guarded(app)
    with pytest.raises(error):
        _call(guard)
    assert counted == [("/v1/chat/completions", status)]
