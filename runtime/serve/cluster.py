"""`aotpack serve --ray`: replicas of one bundle behind Ray Serve's HTTP ingress (extra `aotpack[ray]`).

Owns: the Ray Serve deployment and the driver around it. Each replica is one process that loads the
bundle into its own engine and serves `create_app`'s routes unchanged; Ray Serve's proxy routes each
request to a replica, queues when all are busy, replaces a replica whose process dies, and scales the
count on ongoing requests per replica. aotpack writes none of that itself.

The bundle is opened (hashes, torch and CPU ISA checked) inside each replica's constructor, on the node
Ray placed it on, so a replica on an incompatible node fails with aotpack's own message, which Ray shows
in the deployment status and which `deploy` raises. The driver reads only the manifest: it may run on a
head node that could not run the bundle itself.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from runtime.errors import AotpackError
from runtime.format.reader import read_manifest
from runtime.serve import access
from runtime.serve.app import create_app
from runtime.serve.config import RayConfig, ServeConfig
from runtime.serve.server import bind, signature_note

REPLICA_HEADER = "x-aotpack-replica"  # which replica answered: "host:pid", for clients and tests
# Ray Serve gives its HTTP proxy actor 5 s a readiness check and kills it after three misses; on 2 busy
# cores starting that actor (importing Serve, FastAPI and uvicorn) takes longer, `serve.start` then dies
# with the killed actor. A Ray instance this command starts inherits the variable from it.
PROXY_READY_ENV, PROXY_READY_S = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60"


class DeployError(AotpackError):
    """The application did not come up; the message carries Ray's status, a replica's error included."""


class Replica:
    """One replica: the bundle loaded into an engine, serving the same routes as `aotpack serve`."""

    def __init__(self, config: ServeConfig):
        from runtime.runtime import load

        self.config, self.name = config, f"{socket.gethostname()}:{os.getpid()}"
        try:
            self.rt = load(config.bundle, config.load)
        except AotpackError as e:  # the deployment status shows this line: say which node could not load
            raise type(e)(f"replica on {self.name}: {e}") from None
        self.rt.tokenizer  # noqa: B018 (loaded now: the first request should not pay for it)

    def __serve_build_asgi_app__(self):
        access.install()  # each replica's request lines, in its Ray worker's log
        app = create_app(self.rt, self.config)
        app.add_middleware(_Named, name=self.name)
        return app

    def __del__(self):
        # Ray has already drained this replica for `graceful_shutdown_timeout_s`; cancel what is left.
        if getattr(self, "rt", None) is not None:
            self.rt.engine.close(grace=0)


class _Named:
    """Each response names the replica that answered it (REPLICA_HEADER). Plain ASGI, as the app's guard
    (runtime.serve.app): Starlette's `http` middleware delayed a streaming client's disconnect."""

    def __init__(self, app, name: str):
        self.app, self.header = app, (REPLICA_HEADER.lower().encode(), name.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)


def deployment(config: ServeConfig, ray_config: RayConfig, rows: int):
    """The Ray Serve deployment of `Replica`, sized by `ray_config`; `rows` is the bundle's batch size."""
    from ray import serve

    sizing = (
        {"num_replicas": ray_config.replicas}
        if ray_config.replicas is not None
        else {
            "autoscaling_config": {
                "min_replicas": ray_config.min_replicas,
                "max_replicas": ray_config.max_replicas,
                "target_ongoing_requests": rows,  # a replica decodes `rows` requests at once
            }
        }
    )
    return serve.deployment(
        serve.ingress()(Replica),
        name=ray_config.app_name,
        # Up to two batches per replica: the second waits in the replica's engine and is admitted into
        # rows the moment they free; Ray's proxy queues the rest and sends it to the least-loaded replica.
        max_ongoing_requests=2 * rows,
        max_queued_requests=config.max_queue,  # >= 1: the CLI refuses 0 with --ray
        ray_actor_options={"num_cpus": config.load.num_threads}
        | ({"label_selector": ray_config.label_selector} if ray_config.labels else {}),
        graceful_shutdown_timeout_s=config.shutdown_grace,
        max_constructor_retry_count=ray_config.constructor_retries,
        **sizing,
    )


def deploy(config: ServeConfig, ray_config: RayConfig) -> str:
    """Deploy onto the connected Ray cluster and wait until it serves; returns the base URL."""
    from ray import serve

    rows = read_manifest(config.bundle).batch_size
    # Each replica reserves its threads as Ray CPUs. The path is made absolute here, as replicas do not
    # share the driver's working directory; on a cluster it must name the same bundle on every node.
    keys = config.load.trusted_keys
    load = replace(
        config.load,
        num_threads=config.load.num_threads or 1,
        trusted_keys=tuple(Path(k).resolve() for k in keys) if keys is not None else None,
    )
    config = config.replace(load=load, bundle=Path(config.bundle).resolve())
    _start_proxy(config)
    app = deployment(config, ray_config, rows).bind(config)
    try:
        serve.run(app, name=ray_config.app_name, route_prefix="/")
    except RuntimeError as e:
        reason = _failure(ray_config.app_name) or str(e)
        serve.delete(ray_config.app_name)
        raise DeployError(f"the Ray Serve application '{ray_config.app_name}' did not start: {reason}") from None
    return f"http://{config.host}:{config.port}"


def _start_proxy(config: ServeConfig) -> None:
    """Ray Serve's controller and HTTP proxy; a proxy that does not come up is aotpack's error, not Ray's
    stack."""
    from ray import serve
    from ray.exceptions import RayError

    try:
        serve.start(http_options={"host": config.host, "port": config.port})
    except RayError as e:
        reason = str(e).strip().splitlines()[0]
        raise DeployError(
            f"Ray Serve's HTTP proxy did not start on {config.host}:{config.port}: {reason}; on a loaded "
            f"machine give it longer to start with {PROXY_READY_ENV}=SECONDS in the Ray cluster's environment "
            f"(a Ray instance this command starts uses {os.environ.get(PROXY_READY_ENV, PROXY_READY_S)})"
        ) from None


def _failure(app_name: str) -> str | None:
    """The last line of the failed deployment's status: the replica constructor's exception."""
    from ray import serve

    app = serve.status().applications.get(app_name)
    messages = [d.message for d in app.deployments.values() if d.message] if app else []
    lines = [line for message in messages for line in message.strip().splitlines()]
    return lines[-1] if lines else None


def serve_ray(config: ServeConfig, ray_config: RayConfig, out=sys.stdout) -> None:
    """Start or join Ray, deploy, print one start-up line, serve until SIGTERM or Ctrl-C, tear down."""
    import ray
    from ray import serve

    if config.port == 0:  # Ray's proxy needs a number; take one the system says is free
        with bind(config.host, 0) as sock:
            config = config.replace(port=sock.getsockname()[1])
    start = time.perf_counter()
    if ray_config.address is None:  # the Ray instance is this command's: its processes take this environment
        os.environ.setdefault(PROXY_READY_ENV, PROXY_READY_S)
    ray.init(address=ray_config.address, include_dashboard=False, logging_level="warning", log_to_driver=False)
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    stop = _stop_on_signals()  # after ray.init, which installs its own handlers that print a stack and die
    try:
        url = deploy(config, ray_config)
        sizing = ray_config.describe()
        print(
            f"aotpack serve: {config.bundle} on {url} through Ray Serve ({sizing}, "
            f"Ray at {ray.get_runtime_context().gcs_address}), ready in {time.perf_counter() - start:.1f} s; "
            f"{signature_note(config.load)}",
            file=out,
            flush=True,
        )
        stop.wait()
    finally:
        serve.delete(ray_config.app_name)  # drains replicas for --shutdown-grace
        if ray_config.address is None:
            serve.shutdown()
        ray.shutdown()


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
