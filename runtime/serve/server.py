"""Running the app: load the bundle, bind, one start-up line, serve until SIGTERM or Ctrl-C.

Owns: the process around the app. The socket is bound before uvicorn starts so that the start-up line
names the real address (port 0 picks a free one). On SIGTERM or SIGINT the server stops admitting at
once (readiness goes 503, new requests are refused), uvicorn stops accepting connections and gives the
requests in flight `shutdown_grace` seconds to finish, and the engine cancels whatever is left.
"""

from __future__ import annotations

import signal
import socket
import sys
import time

import uvicorn

from runtime.serve import access
from runtime.serve.app import create_app
from runtime.serve.config import ServeConfig


class _Server(uvicorn.Server):
    def __init__(self, config, app):
        super().__init__(config)
        self.app, self.grace = app, config.timeout_graceful_shutdown

    def handle_exit(self, sig, frame) -> None:
        if self.app.state.ready:  # the first signal: a second one is uvicorn's "stop now"
            running, waiting = self.app.state.rt.engine.load
            access.LOG.info(
                f"{signal.Signals(sig).name}: admitting no more requests; {running} running and {waiting} "
                f"waiting get up to {self.grace:g} s to finish"
            )
        self.app.state.ready = False
        self.app.state.rt.engine.stop_admitting()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        """Said here, not after run(): uvicorn re-raises the signal once this returns, which ends the process."""
        await super().shutdown(sockets)
        access.LOG.info(f"stopped: {self.app.state.metrics.served()} API request(s) answered")


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections queue from now on, even before uvicorn accepts them
    return sock


def signature_note(load) -> str:
    """What start-up says of the bundle's provenance: without --key, only its hashes were checked, and
    whoever can write the bundle folder can write consistent hashes."""
    if load.trusted_keys:
        return f"signature verified with one of the {len(load.trusted_keys)} trusted key(s) given"
    return "signature NOT checked (no --key): hashes catch corruption, not a rewritten bundle"


def serve(config: ServeConfig, out=sys.stdout) -> None:
    from runtime.runtime import load

    start = time.perf_counter()
    rt = load(config.bundle, config.load)
    rt.tokenizer  # noqa: B018 (loaded now: the first request should not pay for it)
    sock = bind(config.host, config.port)
    app = create_app(rt, config)
    host, port = sock.getsockname()[:2]
    m = rt.manifest
    print(
        f"aotpack serve: {config.bundle} ({m.model_class}, {m.dtype}, {m.batch_size} slots, {config.load.backend} "
        f"decode) on http://{host}:{port}, "
        f"loaded in {time.perf_counter() - start:.1f} s; {signature_note(config.load)}",
        file=out,
        flush=True,
    )
    settings = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=config.shutdown_grace
    )
    access.install()
    try:
        _Server(settings, app).run(sockets=[sock])
    finally:
        rt.engine.close()
