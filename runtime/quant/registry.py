"""The quantization schemes by method and kernel family: each registered here explicitly, its module
imported with it (its eager op is registered with torch when the module loads)."""

from __future__ import annotations

from runtime.format.quant import INDUCTOR, INT4, INT5, INT8, INTEGER, QuantSpec
from runtime.quant import int4, int4_dot, int5_dot, int8, int8_dot
from runtime.quant.scheme import Scheme

SCHEMES: dict[tuple[str, str], Scheme] = {
    (INT8, INDUCTOR): int8.SCHEME,
    (INT4, INDUCTOR): int4.SCHEME,
    (INT8, INTEGER): int8_dot.SCHEME,
    (INT4, INTEGER): int4_dot.SCHEME,
    (INT5, INTEGER): int5_dot.SCHEME,
}


def scheme(spec: QuantSpec) -> Scheme:
    return SCHEMES[(spec.method, spec.kernels)]  # anything else is refused earlier, by QuantSpec
