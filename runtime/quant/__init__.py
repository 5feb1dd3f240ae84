"""Weight-only int8 and int4 quantization: the packed format a bundle stores, and the math over it.

What a quantized weight means, whichever kernel reads it: dequantize to fp32 (int8: `q * scale`, one
scale per row; int4: `q * scale + min`, one pair per group of columns), multiply with the activations
in fp32, accumulate in fp32, cast the result to the activation dtype.

One module per scheme (`int8`, `int4`: packing, unpacking, the eager op and the decode lowering
candidates), registered by name in `registry`; `modules` holds the stand-ins for `nn.Linear` and
`nn.Embedding`; `kernels` the building blocks the lowerings share. The eager prefill runs each
scheme's op, and the exporter replaces it in the decode graph with the fastest of its candidates over
the very same tensors, so eager prefill and compiled decode read one copy of every weight.

The words are stored as float32-typed tensors holding raw integer bits: torch 2.13's AVX2
`Vectorized<int32_t>::loadu(ptr, count)` always goes through a memcpy, which Inductor's integer loads
hit; a float load of the same bits is one instruction, and a bitcast makes it an int32 vector again.
Nothing ever does float arithmetic on `words`: it is only viewed as int32.
"""

from runtime.format.quant import GROUP_SIZES, INT4, INT8, METHODS, WORD_FIELDS, QuantSpec
from runtime.quant.modules import PackedWeight, QuantizedEmbedding, QuantizedLinear
from runtime.quant.registry import SCHEMES, scheme


def dequantize(spec: QuantSpec, *tensors):
    """A packed weight's tensors -> fp32 (rows, cols)."""
    return scheme(spec.method).dequantize(spec, *tensors)


__all__ = [
    "GROUP_SIZES",
    "INT4",
    "INT8",
    "METHODS",
    "SCHEMES",
    "WORD_FIELDS",
    "PackedWeight",
    "QuantSpec",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "dequantize",
    "scheme",
]
