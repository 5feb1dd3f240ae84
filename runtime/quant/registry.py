"""The quantization schemes by name: each registered here explicitly, its module imported with it (its
eager op is registered with torch when the module loads)."""

from __future__ import annotations

from runtime.format.quant import INT4, INT8
from runtime.quant import int4, int8
from runtime.quant.scheme import Scheme

SCHEMES: dict[str, Scheme] = {INT8: int8.SCHEME, INT4: int4.SCHEME}


def scheme(method: str) -> Scheme:
    return SCHEMES[method]  # a method outside METHODS is refused earlier, by QuantSpec
