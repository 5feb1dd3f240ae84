"""The server's options, parsed at the edge (runtime.cli) into one frozen, checked config."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from runtime.config import LoadConfig
from runtime.errors import InvalidInputError

PREFILL_CHUNK = 64  # a server prefills long prompts a chunk per decode step: its other streams keep going
# ...each chunk as many tokens (at most PREFILL_CHUNK) as take about this many decode steps' time, so that a
# stream's token gaps stay under 3x their median while a long prompt goes in (runtime.engine.chunking)
PREFILL_BUDGET = 1.0


@dataclass(frozen=True)
class ServeConfig:
    bundle: Path
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = 64  # requests waiting for cache rows before 429
    api_key: str | None = None  # required as `Authorization: Bearer KEY` when set
    max_body_bytes: int = 16 * 2**20  # request bodies, images included (base64)
    max_image_pixels: int = 16 * 2**20  # per decoded image; larger ones (decompression bombs) are refused
    max_request_pixels: int = 32 * 2**20  # all images of one request together, checked before any is decoded
    max_images: int = 8  # images per request
    max_stops: int = 4  # stop strings per request (OpenAI's own bound)
    max_stop_chars: int = 1024  # per stop string (one of a million characters took 16 s and 2.7 GB to match)
    parse_special: bool = False  # control-token strings in message content act as control tokens (else text)
    shutdown_grace: float = 30.0  # seconds in-flight requests get to finish after SIGTERM
    # the model ids requests may name, the first reported by /v1/models (default: the bundle folder's name);
    # a request naming another model gets a 404, as vLLM answers
    served_model_names: tuple[str, ...] = ()
    load: LoadConfig = field(
        default_factory=lambda: LoadConfig(prefill_chunk=PREFILL_CHUNK, prefill_budget=PREFILL_BUDGET)
    )

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise InvalidInputError(f"--port {self.port} must be from 0 to 65535")
        for name in (
            "max_queue",
            "max_body_bytes",
            "max_image_pixels",
            "max_request_pixels",
            "max_images",
            "max_stop_chars",
        ):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.shutdown_grace < 0:
            raise InvalidInputError(f"--shutdown-grace must be >= 0, got {self.shutdown_grace}")
        bad = [name for name in self.served_model_names if not name or not name.isprintable()]
        if bad:
            raise InvalidInputError(f"--served-model-name {bad[0]!r} must be a non-empty printable name")
        if self.api_key is not None and not self.api_key:
            raise InvalidInputError("--api-key is empty; give a key or leave the option out")
        if self.api_key is not None and not (self.api_key.isascii() and self.api_key.isprintable()):
            bad = next(c for c in self.api_key if not (c.isascii() and c.isprintable()))
            raise InvalidInputError(
                f"--api-key holds {bad!r}: a key travels in an HTTP header (`Authorization: Bearer KEY`), where "
                "clients send printable ASCII only, so no client could authenticate; choose an ASCII key"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return self.served_model_names or (Path(self.bundle).resolve().name,)

    @property
    def name(self) -> str:
        """The id replies and /v1/models carry."""
        return self.names[0]

    def replace(self, **changes) -> ServeConfig:
        return replace(self, **changes)


@dataclass(frozen=True)
class RayConfig:
    """`--ray`: a fixed replica count, or autoscaling between `min_replicas` and `max_replicas`."""

    replicas: int | None = None  # None with min/max given: autoscaling; all None: one replica
    min_replicas: int | None = None
    max_replicas: int | None = None
    address: str | None = None  # an existing cluster ("auto", "ray://host:10001"); None starts a local one
    labels: tuple[str, ...] = ()  # "KEY=VALUE": replicas go only to nodes started with these labels
    app_name: str = "aotpack"
    constructor_retries: int = 3  # a replica that cannot load the bundle will not on a retry either

    def __post_init__(self):
        scaling = self.min_replicas is not None or self.max_replicas is not None
        if self.replicas is not None and scaling:
            raise InvalidInputError("--replicas fixes the count; leave out --min-replicas/--max-replicas, or it")
        if self.replicas is None and not scaling:
            object.__setattr__(self, "replicas", 1)
        if self.replicas is not None and self.replicas < 1:
            raise InvalidInputError(f"--replicas must be >= 1, got {self.replicas}")
        if scaling:
            low, high = self.min_replicas or 0, self.max_replicas
            if high is None or high < 1 or low < 0 or low > high:
                raise InvalidInputError(
                    f"autoscaling needs 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, "
                    f"got {self.min_replicas} and {self.max_replicas}"
                )
            object.__setattr__(self, "min_replicas", low)
        for label in self.labels:
            key, _, value = label.partition("=")
            if not key or not value:
                raise InvalidInputError(f"--ray-label {label!r} must be KEY=VALUE, e.g. --ray-label cpu-isa=avx512")

    @property
    def label_selector(self) -> dict[str, str]:
        return dict(label.split("=", 1) for label in self.labels)

    def describe(self) -> str:
        if self.replicas is not None:
            return f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
        return f"{self.min_replicas} to {self.max_replicas} replicas, autoscaling"
