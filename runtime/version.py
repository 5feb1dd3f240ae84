"""aotpack's version, in a module that imports nothing (`aotpack --version` must not load torch)."""

AOTPACK_VERSION = "0.5.0"
