"""Weight-only int8/int4, with no bundle: each scheme's packed format (runtime.quant.int8, int4), its
decode kernels against its eager op, and the export options that refuse a bad quantization."""

from __future__ import annotations

import pytest
import torch

from exporter.config import ExportConfig
from exporter.lowering import CANDIDATES, LINEAR
from runtime.errors import ExportError
from runtime.quant import INT4, INT8, PackedWeight, QuantizedLinear, QuantSpec, dequantize, scheme

SPECS = [QuantSpec(INT8, None), QuantSpec(INT4, 32), QuantSpec(INT4, 64)]


def pack(spec: QuantSpec, weight: torch.Tensor):
    return scheme(spec.method).pack(spec, weight)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_packing_round_trips_values_on_the_grid(spec):
    """A weight that lies exactly on the quantization grid comes back exactly."""
    g = torch.Generator().manual_seed(0)
    rows, cols = 6, 128
    if spec.method == INT8:
        q = torch.randint(-127, 128, (rows, cols), generator=g).float()
        q[:, 0] = 127  # the row maximum fixes the scale
        weight = q * torch.rand(rows, 1, generator=g)
    else:
        q = torch.randint(0, 16, (rows, cols // spec.group_size, spec.group_size), generator=g).float()
        q[..., 0], q[..., 1] = 0, 15  # each group's min and max fix its scale and min
        scale = torch.rand(rows, cols // spec.group_size, 1, generator=g).bfloat16().float()
        low = torch.randn(rows, cols // spec.group_size, 1, generator=g).bfloat16().float()
        weight = (q * scale + low).view(rows, cols)
    restored = dequantize(spec, *pack(spec, weight))
    torch.testing.assert_close(restored, weight, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_packing_error_is_within_half_a_step(spec):
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    tensors = pack(spec, weight)
    error = (dequantize(spec, *tensors) - weight).abs()
    if spec.method == INT8:
        step = tensors[1][:, None]  # one scale per row
    else:
        step = tensors[1].float().repeat_interleave(spec.group_size, dim=1)
    assert (error <= step / 2 + 1e-2 * step).all()  # half a step, plus the bf16 rounding of int4's min


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_decode_kernel_computes_the_eager_op(spec, dtype):
    """The Inductor lowerings, evaluated eagerly, equal the eager op on a batch of 3 (fp32 summation order)."""
    g = torch.Generator().manual_seed(2)
    linear = QuantizedLinear(PackedWeight.of(spec, torch.randn(96, 128, generator=g)))
    x = torch.randn(3, 1, 128, generator=g).to(dtype)
    expected = linear(x)
    args = linear.packed.tensors() + ((spec.group_size,) if spec.method == INT4 else ())
    for name, kernel in CANDIDATES[spec.method].items():
        got = kernel(x, *args)
        assert got.shape == expected.shape and got.dtype == dtype, name
        torch.testing.assert_close(
            got.float(), expected.float(), atol=1e-4 if dtype == torch.float32 else 2e-2, rtol=1e-3
        )


def test_float_decode_kernels_compute_linear():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(2, 1, 48, generator=g), torch.randn(80, 48, generator=g), torch.randn(80, generator=g)
    for kernel in CANDIDATES[LINEAR].values():
        torch.testing.assert_close(kernel(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "int3"}, "--quantize 'int3'"),
        ({"quantize": "int8", "group_size": 32}, "--group-size applies to --quantize int4 only"),
        ({"quantize": "int4", "group_size": 48}, "--group-size 48"),
        ({"gemv": "fastest"}, "--gemv 'fastest'"),
    ],
)
def test_bad_quantization_options_are_refused_before_loading(options, message, tmp_path):
    with pytest.raises(ExportError, match=message.replace("(", r"\(")):
        ExportConfig(model="tiny-llama", out=tmp_path / "b", **options)


def test_group_size_that_does_not_divide_the_layer_is_refused(tmp_path):
    from exporter.export import export

    config = ExportConfig(model="tiny-llama", out=tmp_path / "b", quantize="int4", group_size=128, gemv="aten")
    with pytest.raises(ExportError, match="cannot pack"):  # tiny-llama's layers have 64 input columns
        export(config, log=lambda _: None)
    assert not (tmp_path / "b").exists()
