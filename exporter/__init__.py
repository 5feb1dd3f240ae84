"""aotpack exporter: checkpoint -> bundle. The only package that knows torch.export and AOTInductor.

Writes bundles through the contract in `runtime.format`; `aotpack` (exporter.cli) is its command.
"""
