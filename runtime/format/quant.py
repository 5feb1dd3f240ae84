"""Which weight-only quantizations a bundle may record, without the math (runtime.quant has that).

Owns: the method names, the group sizes offered, how many integers a 32-bit word packs, and the spec
a manifest's quantization entry must satisfy.
"""

from __future__ import annotations

from dataclasses import dataclass

INT8 = "int8"
INT4 = "int4"
METHODS = (INT8, INT4)
GROUP_SIZES = (32, 64, 128)
WORD_FIELDS = {INT8: 4, INT4: 8}  # packed integers per 32-bit word


@dataclass(frozen=True)
class QuantSpec:
    """How a bundle's linear layers and token embedding are quantized."""

    method: str  # INT8 or INT4
    group_size: int | None  # INT4: columns per (scale, min) pair; INT8: None, one scale per row

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"quantization method {self.method!r} is not one of {METHODS}")
        if (self.method == INT4) != (self.group_size is not None):
            raise ValueError("a group size goes with int4 only")
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group size {self.group_size} is not one of {GROUP_SIZES}")

    def accepts(self, cols: int) -> bool:
        """Whether a weight with `cols` input columns can be packed with this spec."""
        return cols % (self.group_size or WORD_FIELDS[self.method]) == 0 and cols % WORD_FIELDS[self.method] == 0
