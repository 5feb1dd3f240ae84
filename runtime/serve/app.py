"""The HTTP layer: OpenAI-compatible routes over one Runtime, on FastAPI.

Owns: routes, authentication, body limits, the OpenAI error shape and status codes, and streaming as
server-sent events. Model work runs in worker threads (preparing inputs) and in the engine's thread
(generation); the event loop only moves text. A client that disconnects mid-stream cancels its request
(the stream's `finally`), which frees its cache rows at the engine's next step.

Status codes: 400 invalid request (aotpack's message), 401 wrong or missing key, 413 body too large,
429 queue full (with Retry-After), 503 shutting down or no free rows in time.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime.errors import EngineClosedError, InvalidInputError, QueueFullError, RuntimeBusyError
from runtime.serve.completion import TextStream, check_stops, generate_options
from runtime.serve.config import ServeConfig
from runtime.serve.messages import ImageBudget, chat_inputs, chat_messages, prompt_inputs
from runtime.serve.metrics import Metrics
from runtime.serve.schema import ChatRequest, CompletionRequest

OPEN_PATHS = ("/health", "/ready", "/metrics")  # no key needed: probes and scrapers


class ServeError(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def error_response(status: int, message: str, kind: str, headers=None) -> JSONResponse:
    """OpenAI's error shape."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def create_app(rt, config: ServeConfig) -> FastAPI:
    app = FastAPI(title="aotpack", docs_url=None, redoc_url=None)
    app.state.rt, app.state.config, app.state.ready = rt, config, True
    app.state.metrics = Metrics(rt.engine, rt.contract.batch_size)
    _install_guards(app, config)
    _install_errors(app)
    _install_probes(app)
    _install_generation(app)
    return app


def _install_guards(app: FastAPI, config: ServeConfig) -> None:
    app.add_middleware(_BodyLimit, limit=config.max_body_bytes)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if config.api_key and request.url.path not in OPEN_PATHS and not _authorized(request, config.api_key):
            return _counted(app, request, error_response(401, "invalid or missing API key", "authentication_error"))
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > config.max_body_bytes):
            message = f"request body over this server's limit of {config.max_body_bytes} bytes"
            return _counted(app, request, error_response(413, message, "invalid_request_error"))
        return _counted(app, request, await call_next(request))


class _BodyTooLarge(StarletteHTTPException):
    """An HTTPException, so that FastAPI's body reading re-raises it as it is (it turns other errors
    into a 400) and the app's handler answers it in OpenAI's shape."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body over this server's limit of {limit} bytes")


class _BodyLimit:
    """Counts the body bytes actually received: a chunked body carries no Content-Length for the guard
    to check up front (a 300 MB one was read whole and answered 200). FastAPI's own `max_body_size`
    answers in plain text."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


def _authorized(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "")
    return given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), key.encode())


def _counted(app: FastAPI, request: Request, response: Response) -> Response:
    if request.url.path.startswith("/v1/"):
        app.state.metrics.requests.labels(request.url.path, str(response.status_code)).inc()
    return response


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        return error_response(
            400, f"{where}: {first.get('msg', 'invalid request')}".strip(": "), "invalid_request_error"
        )

    @app.exception_handler(ServeError)
    async def served(_, exc: ServeError):
        return error_response(exc.status, exc.message, exc.kind, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http(_, exc: StarletteHTTPException):
        """FastAPI's own (a body it cannot parse: nesting too deep, an integer too long; a 404, a 405) in
        OpenAI's error shape, not `{"detail": ...}`."""
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error_response(exc.status_code, str(exc.detail), kind, getattr(exc, "headers", None))


def _install_probes(app: FastAPI) -> None:
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if not app.state.ready:
            return error_response(503, "shutting down", "unavailable")
        return {"status": "ready", "slots": app.state.rt.contract.batch_size}

    @app.get("/metrics")
    async def metrics():
        return Response(app.state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        card = {"id": app.state.config.name, "object": "model", "created": 0, "owned_by": "aotpack"}
        return {"object": "list", "data": [card]}


def _install_generation(app: FastAPI) -> None:
    budget = _image_budget(app.state.rt, app.state.config)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        def inputs(rt):
            return chat_inputs(rt, chat_messages(body.messages, budget), app.state.config.parse_special)

        return await _respond(app, request, body, inputs, "chat")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _respond(app, request, body, lambda rt: prompt_inputs(rt, body.prompt), "text")


def _image_budget(rt, config: ServeConfig) -> ImageBudget:
    slots = getattr(rt.model.config, "mm_tokens_per_image", None)  # Gemma 3's 256 soft tokens an image
    return ImageBudget(
        rt.is_multimodal,
        config.max_image_pixels,
        config.max_request_pixels,
        config.max_images,
        rt.contract.max_cache_len,
        slots if isinstance(slots, int) else None,
    )


async def _respond(app: FastAPI, request: Request, body, build_inputs, kind: str):
    rt = app.state.rt
    inputs, handle, options = await run_in_threadpool(_submit, app, body, build_inputs)
    prompt_tokens = inputs["input_ids"].shape[1]
    text = TextStream(rt.tokenizer, handle, body.stop)
    reply = Reply(kind, app.state.config.name, prompt_tokens)
    if body.stream:
        return StreamingResponse(_events(app, handle, text, reply, body), media_type="text/event-stream")
    try:
        content = "".join(await _unless_gone(request, handle, run_in_threadpool(list, text)))
    except Exception as e:
        raise _failure(e) from None
    finally:
        handle.cancel()
        app.state.metrics.finished(handle, prompt_tokens)
    return reply.whole(content, text)


def _submit(app: FastAPI, body, build_inputs):
    """Inputs, validation and queueing, in a worker thread: aotpack's errors become HTTP errors."""
    rt, config = app.state.rt, app.state.config
    try:
        check_stops(body.stop, config.max_stops, config.max_stop_chars)
        inputs = build_inputs(rt)
        options = generate_options(body, rt, inputs["input_ids"].shape[1])
        handle = rt.submit(**inputs, max_waiting=config.max_queue, **options)
    except QueueFullError as e:
        raise ServeError(429, str(e), "rate_limit_error", {"Retry-After": "1"}) from None
    except EngineClosedError as e:
        raise ServeError(503, str(e), "unavailable") from None
    except InvalidInputError as e:
        raise ServeError(400, str(e), "invalid_request_error") from None
    return inputs, handle, options


async def _unless_gone(request: Request, handle, work):
    """Await `work` (the whole reply), cancelling the request if its client hangs up meanwhile: rows
    would otherwise go on generating for nobody. (A stream notices at its next write.)"""
    task = asyncio.ensure_future(work)
    while not (await asyncio.wait({task}, timeout=_DISCONNECT_POLL))[0]:
        if await request.is_disconnected():
            handle.cancel()  # the reply then ends at the engine's next step, and the task with it
    return task.result()


_DISCONNECT_POLL = 0.25  # seconds between two looks at a non-streaming request's connection


def _failure(error: Exception) -> ServeError:
    """What a request that failed while generating answers: its own fault (a distribution that overflowed,
    say) is a 400, no free rows in time a 503, anything else a 500, each in OpenAI's error shape."""
    if isinstance(error, RuntimeBusyError):
        return ServeError(503, str(error), "unavailable", {"Retry-After": "1"})
    if isinstance(error, InvalidInputError):
        return ServeError(400, str(error), "invalid_request_error")
    return ServeError(500, f"generation failed: {type(error).__name__}: {str(error)[:300]}", "server_error")


async def _events(app: FastAPI, handle, text: TextStream, reply: Reply, body):
    """Server-sent events; the `finally` runs on completion and on a client's disconnect alike."""
    try:
        yield reply.event(reply.chunk(""))  # the role first, as OpenAI does
        async for piece in iterate_in_threadpool(iter(text)):
            yield reply.event(reply.chunk(piece))
        yield reply.event(reply.chunk(None, text.finish_reason))
        if body.include_usage:
            yield reply.event(reply.usage_chunk(text))
        yield "data: [DONE]\n\n"
    except Exception as e:  # the stream has started (200), so the failure is said in-band, then it ends
        failure = _failure(e)
        yield reply.event({"error": {"message": failure.message, "type": failure.kind, "param": None, "code": None}})
        yield "data: [DONE]\n\n"
    finally:
        handle.cancel()
        app.state.metrics.finished(handle, reply.prompt_tokens)


class Reply:
    """OpenAI response bodies of one request ("chat" or "text" completion)."""

    def __init__(self, kind: str, model: str, prompt_tokens: int):
        self.kind, self.model, self.prompt_tokens = kind, model, prompt_tokens
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _body(self, obj: str, choice: dict) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    def usage(self, text: TextStream) -> dict:
        done = text.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "total_tokens": self.prompt_tokens + done,
        }

    def whole(self, content: str, text: TextStream) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None}
            body = self._body("chat.completion", choice | {"finish_reason": text.finish_reason})
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": text.finish_reason}
            body = self._body("text_completion", choice)
        return body | {"usage": self.usage(text)}

    def chunk(self, piece: str | None, finish: str | None = None) -> dict:
        if self.kind == "chat":
            delta = (
                {} if piece is None else ({"role": "assistant", "content": ""} if piece == "" else {"content": piece})
            )
            return self._body("chat.completion.chunk", {"index": 0, "delta": delta, "finish_reason": finish})
        return self._body(
            "text_completion", {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
        )

    def usage_chunk(self, text: TextStream) -> dict:
        body = self._body("chat.completion.chunk" if self.kind == "chat" else "text_completion", {})
        return body | {"choices": [], "usage": self.usage(text)}

    @staticmethod
    def event(payload: dict) -> str:
        return f"data: {json.dumps(payload)}\n\n"
