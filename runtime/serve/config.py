"""The server's options, parsed at the edge (runtime.cli) into one frozen, checked config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.errors import InvalidInputError


@dataclass(frozen=True)
class ServeConfig:
    bundle: Path
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = 64  # requests waiting for cache rows before 429
    api_key: str | None = None  # required as `Authorization: Bearer KEY` when set
    prefill_chunk: int | None = 64  # long prompts prefilled a chunk per decode step (None: whole)
    threads: int | None = None
    max_body_bytes: int = 16 * 2**20  # request bodies, images included (base64)
    max_image_pixels: int = 16 * 2**20  # per decoded image; larger ones (decompression bombs) are refused
    shutdown_grace: float = 30.0  # seconds in-flight requests get to finish after SIGTERM
    model_name: str | None = None  # the id /v1/models reports (default: the bundle directory's name)

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise InvalidInputError(f"--port {self.port} must be from 0 to 65535")
        for name in ("max_queue", "max_body_bytes", "max_image_pixels"):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise InvalidInputError(f"--prefill-chunk must be >= 1 (or 0 for whole prompts), got {self.prefill_chunk}")
        if self.shutdown_grace < 0:
            raise InvalidInputError(f"--shutdown-grace must be >= 0, got {self.shutdown_grace}")
        if self.api_key is not None and not self.api_key:
            raise InvalidInputError("--api-key is empty; give a key or leave the option out")

    @property
    def name(self) -> str:
        return self.model_name or Path(self.bundle).resolve().name
