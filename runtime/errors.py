"""Every exception aotpack raises on purpose.

Owns: the error hierarchy. Each names the bad value and the fix; catching `AotpackError` catches all.
"""


class AotpackError(Exception):
    """Base class of aotpack's own errors."""


class BundleError(AotpackError):
    """A bundle is missing, incomplete or altered."""


class ManifestError(BundleError):
    """manifest.json is malformed or of an unsupported format_version."""


class IntegrityError(BundleError):
    """A bundle file is missing, altered or not listed in the manifest."""


class IncompatibleBundleError(BundleError):
    """The bundle was built for another torch, device or CPU ISA than this process has."""


class InvalidInputError(AotpackError, ValueError):
    """A generate() argument is out of range, of the wrong type, or on the wrong device."""


class CacheOverflowError(InvalidInputError):
    """Prompt plus new tokens do not fit in the bundle's KV cache."""


class ImageInputError(InvalidInputError):
    """An image argument cannot be used with this bundle or prompt."""


class ExportError(AotpackError):
    """The exporter refuses a model, an option or a failed parity check."""


class RuntimeBusyError(AotpackError, RuntimeError):
    """No cache rows came free for a request within the runtime's busy_timeout."""


class EngineClosedError(RuntimeBusyError):
    """The runtime is shutting down (Engine.close) and admits no new requests."""


class QueueFullError(RuntimeBusyError):
    """Too many requests are already waiting for cache rows (a server's --max-queue)."""
