"""int8 and int4 quantization: the packed formats a bundle stores, and the math over them.

What a quantized weight means, whichever kernel reads it: int8, `q * scale` with one scale per row;
int4, `q * scale + min` with one pair per group of columns; int5 (some of an int4 bundle's weights, the
integer family only), `(q - 16) * scale` with one scale per group. Two kernel families compute a linear layer
over it (runtime.format.quant): the integer family quantizes the activations too, per block of 32, and
multiplies integers in aotpack's C++ kernels (runtime.quant.native); the inductor family dequantizes
the weight and multiplies in fp32, in Inductor-generated reductions.

One module per scheme (`int8`, `int4`: the inductor family's packing, eager op and decode lowering
candidates; `int8_dot`, `int4_dot`, `int5_dot`: the integer family's layout and eager op), registered by method and
family in `registry`; `modules` holds the stand-ins for `nn.Linear` and `nn.Embedding`; `kernels` the
building blocks the Inductor lowerings share. The eager prefill runs each scheme's op, and the compiled
decode reads the very same tensors, so eager prefill and compiled decode read one copy of every weight.

The inductor family's words are float32-typed tensors holding raw integer bits: torch 2.13's AVX2
`Vectorized<int32_t>::loadu(ptr, count)` always goes through a memcpy, which Inductor's integer loads
hit; a float load of the same bits is one instruction, and a bitcast makes it an int32 vector again.
Nothing ever does float arithmetic on `words`: it is only viewed as int32.
"""

from runtime.format.quant import GROUP_SIZES, INDUCTOR, INT4, INT8, INTEGER, KERNELS, METHODS, QuantSpec
from runtime.quant.modules import PackedWeight, QuantizedEmbedding, QuantizedLinear
from runtime.quant.registry import SCHEMES, scheme


def dequantize(spec: QuantSpec, *tensors):
    """A packed weight's tensors -> fp32 (rows, cols)."""
    return scheme(spec).dequantize(spec, *tensors)


__all__ = [
    "GROUP_SIZES",
    "INDUCTOR",
    "INT4",
    "INT8",
    "INTEGER",
    "KERNELS",
    "METHODS",
    "SCHEMES",
    "PackedWeight",
    "QuantSpec",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "dequantize",
    "scheme",
]
