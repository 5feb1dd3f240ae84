"""Which quantizations a bundle may record, without the math (runtime.quant has that).

Owns: the method names, the two kernel families and the layout each implies, the group sizes offered,
and the spec a manifest's quantization entry must satisfy.

Two families compute a quantized linear layer, and each stores its weights in the layout its kernels read:
- `integer` (the default on CPUs): the activations are quantized too, per block of 32 columns to int8 with
  one fp32 step each (llama.cpp's Q8_0), and multiplied with the weights in integers (VNNI `dpbusd`,
  AVX2 `maddubs`) by aotpack's own C++ kernels, which the bundle carries (`kernels.so`). Rows are stored
  in tiles of 16, one row to each lane of a vector, groups of 4 columns of the 16 rows together (int8
  bytes plus 128; int4 nibbles, two groups to a byte; int5 int4's nibbles and a plane of fifth bits),
  the rows past the last whole tile as they are (runtime.quant.tiles, int8_dot, int4_dot, int5_dot). An
  int4 bundle may hold some weights at int5 (llama.cpp's Q5_0), which only this family reads.
- `inductor`: weight-only. Each weight is dequantized to fp32 and multiplied with fp32 activations by
  Inductor-generated reductions (and on CUDA). int8 words hold 4 bytes planar by quarters, int4 words 8
  sequential nibbles (runtime.quant.int8, runtime.quant.int4).
"""

from __future__ import annotations

from dataclasses import dataclass

INT8 = "int8"
INT4 = "int4"
INT5 = "int5"  # an int4 bundle's 5-bit weights (llama.cpp's Q5_0): the integer family only
METHODS = (INT8, INT4)  # a bundle's method (--quantize)
WEIGHT_METHODS = (*METHODS, INT5)  # a weight's: an int4 bundle holds some at int8 or int5 (its recipe)
GROUPED = (INT4, INT5)  # the methods with a scale per group of columns
INT5_GROUP = 32  # int5's columns per scale, whatever the bundle's int4 group size: Q5_0's block
INTEGER = "integer"
INDUCTOR = "inductor"
KERNELS = (INTEGER, INDUCTOR)
GROUP_SIZES = (32, 64, 128)
WORD_FIELDS = {INT8: 4, INT4: 8}  # the inductor family: packed integers per 32-bit word
# The layout each family's kernels read, recorded in the manifest: a layout this runtime does not read
# is refused by name (a kernel that changes how it reads its weights changes its tag).
LAYOUTS = {INTEGER: "lanes16", INDUCTOR: "words"}


@dataclass(frozen=True)
class QuantSpec:
    """How one weight is quantized: its method, int4's group size, and the kernel family (and so the
    layout) that reads it."""

    method: str  # INT8, INT4 or INT5
    group_size: int | None  # INT4: columns per (scale, min) pair; INT5: per scale; INT8: None, one scale per row
    kernels: str  # INTEGER or INDUCTOR

    def __post_init__(self):
        if self.method not in WEIGHT_METHODS:
            raise ValueError(f"quantization method {self.method!r} is not one of {WEIGHT_METHODS}")
        if (self.method in GROUPED) != (self.group_size is not None):
            raise ValueError(f"a group size goes with {' and '.join(GROUPED)} only")
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise ValueError(f"{self.method} group size {self.group_size} is not one of {GROUP_SIZES}")
        if self.kernels not in KERNELS:
            raise ValueError(f"quantization kernels {self.kernels!r} is not one of {KERNELS}")
        if self.method == INT5 and self.kernels != INTEGER:
            raise ValueError(f"{INT5} weights are read by the {INTEGER} kernels only, not {self.kernels!r}")

    def accepts(self, cols: int) -> bool:
        """Whether a weight with `cols` input columns can be packed with this spec."""
        if self.method in GROUPED:  # whole groups (a group is whole blocks of 32 and whole words)
            return cols % self.group_size == 0
        return self.kernels == INTEGER or cols % WORD_FIELDS[INT8] == 0

    def __str__(self) -> str:
        group = f"/{self.group_size}" if self.group_size else ""
        return f"{self.method}{group} ({self.kernels})"
