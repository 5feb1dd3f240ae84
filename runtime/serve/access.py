"""The server's log: one line per API request, and a line each when it starts stopping and when it stops.

Owns: the `aotpack.serve` logger's lines and their fields (logfmt, `key=value`, one request a line, so
both a person tailing it and a log shipper can read it). A generation's line is written when its reply
has ended (streamed or not), with its tokens, finish reason and times; any other /v1/ request's (a 401,
a 400 before generating, /v1/models) when its response is made. The probes (/health, /ready, /metrics)
are not logged: orchestrators call them every few seconds.
"""

from __future__ import annotations

import logging
import sys
import time

LOG = logging.getLogger("aotpack.serve")


def install(stream=sys.stderr) -> None:
    """Write the log to `stream` (uvicorn's own access log stays off: it has no tokens or times)."""
    if not any(getattr(h, "aotpack", False) for h in LOG.handlers):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s aotpack serve: %(message)s"))
        handler.aotpack = True
        LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False


def line(**fields) -> str:
    """logfmt: values with spaces or quotes are quoted; None is left out."""
    return " ".join(f"{key}={_value(value)}" for key, value in fields.items() if value is not None)


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    text = str(value)
    return f'"{text.replace(chr(34), chr(39))}"' if not text or any(c in text for c in ' "=') else text


def request_done(request, status: int, **fields) -> None:
    """The line of one request: method, path, status, client and seconds since it arrived."""
    started = getattr(request.state, "arrived", None)
    seconds = time.perf_counter() - started if started is not None else None
    client = request.client.host if request.client else None
    LOG.info(line(method=request.method, path=request.url.path, status=status, client=client, **fields, s=seconds))


def generation_done(request, reply_id: str, handle, text, prompt_tokens: int) -> None:
    """A generation's line once its reply has ended: tokens both ways, why it ended, time to first token."""
    times = handle.times
    finish = text.finish_reason or ("cancelled" if handle.cancelled else "error" if handle.error else None)
    first = times[0] - handle.submitted if times else None
    request_done(
        request, 200, id=reply_id, prompt_tokens=prompt_tokens, completion_tokens=text.completion_tokens,
        finish=finish, ttft_s=first,
    )  # fmt: skip
