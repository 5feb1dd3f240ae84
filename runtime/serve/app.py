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
import functools
import hmac
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from runtime.errors import EngineClosedError, InvalidInputError, QueueFullError, RuntimeBusyError
from runtime.serve import access, tools
from runtime.serve.choices import TextStream
from runtime.serve.completion import check_stops, generate_options, n_choices
from runtime.serve.config import ServeConfig
from runtime.serve.messages import ImageBudget, chat_inputs, chat_messages, prompt_inputs
from runtime.serve.metrics import Metrics
from runtime.serve.reply import Reply
from runtime.serve.schema import ChatRequest, CompletionRequest
from runtime.serve.toolstream import ReplyReader

OPEN_PATHS = ("/health", "/ready", "/metrics")  # no key needed: probes and scrapers


class ServeError(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict | None = None, **where):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}
        self.where = where  # param and code, where OpenAI's shape names them


def error_response(status: int, message: str, kind: str, headers=None, param=None, code=None) -> JSONResponse:
    """OpenAI's error shape."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
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
    app.add_middleware(_Guard, served=app, config=config)  # added last: the outermost


class _Guard:
    """Before any route: the API key and a declared body size; after it, each API response counted and
    logged. Plain ASGI: Starlette's `http` middleware runs the app in a task of its own, which kept a
    streaming reply generating for seconds after its client left (91 more steps of 120, against 3) and
    hid a whole reply's hang-up from `is_disconnected()`."""

    def __init__(self, app, served: FastAPI, config: ServeConfig):
        self.app, self.served, self.config = app, served, config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)  # its headers and path: the body stays unread for the route
        request.state.arrived = time.perf_counter()
        refusal = _refusal(request, self.config)
        if refusal is not None:
            _counted(self.served, request, refusal.status_code)
            return await refusal(scope, receive, send)
        status = None

        async def sent(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        except asyncio.CancelledError:  # Ray cancels a request whose client left; a shutdown, what is left
            status = status or 499
            raise
        finally:
            _counted(self.served, request, status or 500)  # 500: an error before any reply


def _refusal(request: Request, config: ServeConfig) -> Response | None:
    """A 401 without the API key, a 413 for a declared body over the limit, or None."""
    if config.api_key and request.url.path not in OPEN_PATHS and not _authorized(request, config.api_key):
        return error_response(401, "invalid or missing API key", "authentication_error")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > config.max_body_bytes):
        message = f"request body over this server's limit of {config.max_body_bytes} bytes"
        return error_response(413, message, "invalid_request_error")
    return None


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


def _counted(app: FastAPI, request: Request, status: int) -> None:
    """Count and log an API request's response; a generation logs its own line at its reply's end."""
    if request.url.path.startswith("/v1/"):
        app.state.metrics.requests.labels(request.url.path, str(status)).inc()
        if not getattr(request.state, "generating", False):
            access.request_done(request, status)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(_, exc: RequestValidationError):
        """pydantic's first complaint, said as OpenAI says one: the field in `param`, the message without
        pydantic's "Value error, " (aotpack's own checks say what to send instead)."""
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        return error_response(400, f"{where}: {message}".strip(": "), "invalid_request_error", param=where or None)

    @app.exception_handler(ServeError)
    async def served(_, exc: ServeError):
        return error_response(exc.status, exc.message, exc.kind, exc.headers, **exc.where)

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
        cards = [
            {"id": name, "object": "model", "created": 0, "owned_by": "aotpack"} for name in app.state.config.names
        ]
        return {"object": "list", "data": cards}


def _install_generation(app: FastAPI) -> None:
    budget = _image_budget(app.state.rt, app.state.config)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        def inputs(rt):
            template = {"add_generation_prompt": body.add_generation_prompt, "tools": body.tool_dicts}
            template["continue_final_message"] = body.continue_final_message
            return chat_inputs(rt, chat_messages(body.messages, budget), app.state.config.parse_special, **template)

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
    if body.model is not None and body.model not in app.state.config.names:  # vLLM's answer, word for word
        raise ServeError(404, f"The model `{body.model}` does not exist.", "NotFoundError", param="model", code=404)
    inputs, handle, copies = await run_in_threadpool(_submit, app, body, build_inputs)
    request.state.generating = True  # logged when the reply ends (_ended), not when the response starts
    prompt_tokens = inputs["input_ids"].shape[1]
    text = TextStream(rt.tokenizer, handle, body.stop, body.alternatives, copies)
    reader = _reader(rt, body, inputs["input_ids"])
    reply = Reply(kind, body.model or app.state.config.name, prompt_tokens, text, reader)  # an alias is itself
    if body.stream:
        return StreamingResponse(_events(app, request, handle, text, reply, body), media_type="text/event-stream")
    try:
        await _unless_gone(request, handle, _read(text))  # each choice keeps its own text
    except Exception as e:
        request.state.generating = False  # the error response's own line says its status
        raise _failure(e) from None
    finally:
        _ended(app, request, handle, text, reply)
    return reply.whole()


async def _read(text: TextStream) -> None:
    """A whole reply's text, read on the loop as the engine's thread wakes it (Handle.items)."""
    async for _ in text:
        pass


def _reader(rt, body, prompt_ids):
    """For a request with tools: what makes a choice's ReplyReader (runtime.serve.toolstream); else None."""
    if getattr(body, "tool_mode", None) is None:
        return None
    prefix = rt.tokenizer.decode(prompt_ids[0].tolist())  # what the parser reads the reply after, once
    template = tools.response_template(rt)
    return functools.partial(ReplyReader, rt.tokenizer, template, prefix, body.tool_dicts, body.stop)


def _ended(app: FastAPI, request: Request, handle, text: TextStream, reply: Reply) -> None:
    """A reply has ended (or its client left): free its rows, record its tokens and times."""
    handle.cancel()
    app.state.metrics.finished(handle, reply.prompt_tokens)
    if request.state.generating:
        access.generation_done(request, reply.id, handle, text, reply.prompt_tokens)


def _submit(app: FastAPI, body, build_inputs):
    """Inputs, validation and queueing, in a worker thread: aotpack's errors become HTTP errors."""
    rt, config = app.state.rt, app.state.config
    try:
        check_stops(body.stop, config.max_stops, config.max_stop_chars)
        inputs = build_inputs(rt)
        options, copies = n_choices(body, rt, generate_options(body, rt, inputs["input_ids"].shape[1]))
        wants = body.alternatives is not None  # logprobs: the raw logits come with each step's tokens
        sampler = "hf" if "generator" in options else "top-k"  # a seed asks for generate's own draws
        handle = rt.submit(**inputs, max_waiting=config.max_queue, want_logits=wants, sampler=sampler, **options)
    except QueueFullError as e:
        raise ServeError(429, str(e), "rate_limit_error", {"Retry-After": "1"}) from None
    except EngineClosedError as e:
        raise ServeError(503, str(e), "unavailable") from None
    except InvalidInputError as e:
        raise ServeError(400, str(e), "invalid_request_error") from None
    return inputs, handle, copies


async def _unless_gone(request: Request, handle, work):
    """Await `work` (the whole reply), cancelling the request if its client hangs up meanwhile: rows
    would otherwise go on generating for nobody. (A stream notices at its next write.)"""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_hung_up(request))
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if gone in done and gone.exception() is None and not task.done():
            handle.cancel()  # the reply then ends at the engine's next step, and the task with it
        return await task
    finally:
        gone.cancel()
        for left in (task, gone):  # when this coroutine is itself cancelled: their errors are read, not logged
            left.add_done_callback(lambda t: t.cancelled() or t.exception())


async def _hung_up(request: Request) -> None:
    """Returns when the client disconnects. The body is read, so the next message is the disconnect.
    Starlette's `is_disconnected()` looks under an already cancelled scope, and behind an `http`
    middleware (the guard) that look never completed: it answered False after the client had gone."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _failure(error: Exception) -> ServeError:
    """What a request that failed while generating answers: its own fault (a distribution that overflowed,
    say) is a 400, no free rows in time a 503, anything else a 500, each in OpenAI's error shape."""
    if isinstance(error, RuntimeBusyError):
        return ServeError(503, str(error), "unavailable", {"Retry-After": "1"})
    if isinstance(error, InvalidInputError):
        return ServeError(400, str(error), "invalid_request_error")
    return ServeError(500, f"generation failed: {type(error).__name__}: {str(error)[:300]}", "server_error")


async def _events(app: FastAPI, request: Request, handle, text: TextStream, reply: Reply, body):
    """Server-sent events; the `finally` runs on completion and on a client's disconnect alike."""
    try:
        for chunk in reply.opening():  # the role first, as OpenAI does
            yield reply.event(chunk)
        async for row, piece in text:  # the engine's thread wakes this loop (Handle.items)
            for chunk in reply.pieces(row, piece):
                yield reply.event(chunk)
        for chunk in reply.closing():
            yield reply.event(chunk)
        if body.include_usage:
            yield reply.event(reply.usage_chunk())
        yield "data: [DONE]\n\n"
    except Exception as e:  # the stream has started (200), so the failure is said in-band, then it ends
        failure = _failure(e)
        yield reply.event({"error": {"message": failure.message, "type": failure.kind, "param": None, "code": None}})
        yield "data: [DONE]\n\n"
    finally:
        _ended(app, request, handle, text, reply)
