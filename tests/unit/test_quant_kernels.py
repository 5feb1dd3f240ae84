"""int8/int4, with no bundle: each scheme's packed format (runtime.quant.int8, int4, int8_dot, int4_dot),
the inductor family's decode kernels against their eager op, the recipes and the scale search, and the
export options that refuse a bad quantization (the integer kernels themselves: test_integer_kernels.py)."""

from __future__ import annotations

import pytest
import torch

from exporter import kernels, scales
from exporter.config import ExportConfig
from exporter.lowering import CANDIDATES, LINEAR
from exporter.quantize import held_paths, more_bits
from runtime.errors import ExportError
from runtime.format.manifest import BF16_LOWERINGS
from runtime.quant import (
    INDUCTOR,
    INT4,
    INT8,
    INTEGER,
    PackedWeight,
    QuantizedLinear,
    QuantSpec,
    dequantize,
    int4,
    scheme,
)

SPECS = [
    QuantSpec(method, group, kernels)
    for method, group in ((INT8, None), (INT4, 32), (INT4, 64))
    for kernels in (INDUCTOR, INTEGER)
]
INDUCTOR_SPECS = [spec for spec in SPECS if spec.kernels == INDUCTOR]


def pack(spec: QuantSpec, weight: torch.Tensor):
    return scheme(spec).pack(spec, weight)


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
    ids = torch.tensor([5, 0, 3])  # the embedding lookup reads the same values, whatever the layout
    torch.testing.assert_close(scheme(spec).gather(spec, pack(spec, weight), ids), weight[ids], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_packing_error_is_within_half_a_step(spec):
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    tensors = pack(spec, weight)
    error = (dequantize(spec, *tensors) - weight).abs()
    if spec.method == INT8:
        step = tensors[1][:, None]  # one scale per row
    else:
        scales = scheme(spec).grid(spec, weight)[1]  # as chosen, before any layout of the integer family's
        step = scales.float().repeat_interleave(spec.group_size, dim=1)
    assert (error <= step / 2 + 1e-2 * step).all()  # half a step, plus the bf16 rounding of int4's min


@pytest.mark.parametrize("spec", INDUCTOR_SPECS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_decode_kernel_computes_the_eager_op(spec, dtype):
    """The Inductor lowerings, evaluated eagerly, equal the eager op on a batch of 3 (fp32 summation order)."""
    g = torch.Generator().manual_seed(2)
    linear = QuantizedLinear(PackedWeight.of(spec, torch.randn(96, 128, generator=g)))
    x = torch.randn(3, 1, 128, generator=g).to(dtype)
    expected = linear(x)
    args = linear.packed.tensors() + ((spec.group_size,) if spec.method == INT4 else ())
    for name, kernel in CANDIDATES[scheme(spec).name].items():
        got = kernel(x, *args)
        assert got.shape == expected.shape and got.dtype == dtype, name
        torch.testing.assert_close(
            got.float(), expected.float(), atol=1e-4 if dtype == torch.float32 else 2e-2, rtol=1e-3
        )


def test_float_decode_kernels_compute_linear():
    kernels.build(log=lambda _: None)  # aotpack's dense GEMM is one of them: its library serves the op
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(2, 1, 48, generator=g), torch.randn(80, 48, generator=g), torch.randn(80, generator=g)
    for name, kernel in CANDIDATES[LINEAR].items():
        if name not in BF16_LOWERINGS:  # bf16 only: tests/unit/test_bf16_kernels.py
            torch.testing.assert_close(kernel(x, w, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quantize": "int3"}, "--quantize 'int3'"),
        ({"quantize": "int8", "group_size": 32}, "--group-size applies to --quantize int4 only"),
        ({"quantize": "int4", "group_size": 48}, "--group-size 48"),
        ({"gemv": "fastest"}, "--gemv 'fastest'"),
        ({"gemv": "dense", "quantize": "int8"}, "--gemv dense runs aotpack's CPU GEMM over float weights"),
        ({"gemv": "tiles", "quantize": "int8"}, "--gemv tiles runs aotpack's CPU GEMM over float weights"),
        ({"gemv": "tiles"}, "--gemv tiles multiplies bf16 on AMX tiles; add --dtype bfloat16"),
        ({"gemv": "tiles", "dtype": "bfloat16", "cpu_isa": "avx2"}, "drop --cpu-isa avx2"),
        ({"gemv": "dpbf16", "quantize": "int8"}, "--gemv dpbf16 runs aotpack's CPU GEMM over float weights"),
        ({"gemv": "dpbf16"}, "--gemv dpbf16 multiplies bf16 with vdpbf16ps; add --dtype bfloat16"),
        ({"gemv": "dpbf16", "dtype": "bfloat16", "cpu_isa": "avx2"}, "drop --cpu-isa avx2"),
        ({"quantize": "int8", "quant_kernels": "fast"}, "--quant-kernels 'fast'"),
        ({"quantize": "int4", "recipe": "q4_k_m"}, "--recipe 'q4_k_m'"),
        ({"quantize": "int4", "scale_search": "hqq"}, "--scale-search 'hqq'"),
        ({"quantize": "int8", "quant_kernels": "integer", "device": "cuda"}, "use --quant-kernels inductor"),
        ({"decode_attention": "paged"}, "--decode-attention 'paged' is not supported"),
        ({"decode_attention": "grouped", "device": "cuda"}, "--decode-attention grouped picks a CPU kernel"),
    ],
)
def test_bad_quantization_options_are_refused_before_loading(options, message, tmp_path):
    with pytest.raises(ExportError, match=message.replace("(", r"\(")):
        ExportConfig(model="tiny-llama", out=tmp_path / "b", **options)


def test_dpbf16_on_a_cpu_without_avx512_bf16_is_refused_naming_the_flag(tmp_path, monkeypatch):
    from exporter import config

    monkeypatch.setattr(config, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    with pytest.raises(ExportError, match=r"this CPU lacks \['avx512_bf16'\]; use --gemv tune or dense"):
        ExportConfig(model="tiny-llama", out=tmp_path / "b", gemv="dpbf16", dtype="bfloat16")


def test_group_size_that_does_not_divide_the_layer_is_refused(tmp_path):
    from exporter.export import export

    config = ExportConfig(
        model="tiny-llama", out=tmp_path / "b", quantize="int4", group_size=128, gemv="aten", recipe="uniform"
    )
    with pytest.raises(ExportError, match="cannot pack"):  # tiny-llama's layers have 64 input columns
        export(config, log=lambda _: None)
    assert not (tmp_path / "b").exists()


def test_use_more_bits_picks_llama_cpps_layers():
    """llama.cpp's `use_more_bits` for 18 layers (Gemma 3 270M): the first two, the last three, every third between."""
    assert [i for i in range(18) if more_bits(i, 18)] == [0, 1, 4, 7, 10, 13, 15, 16, 17]


def test_recipes_hold_what_llama_cpp_gives_more_bits():
    """`sensitive` holds Q4_K_M's Q6_K tensors (lm_head, embedding, the picked layers' v and down projections)
    at int8; `mixed` adds the other weights whose width is not a multiple of 256 (Q4_K_M's Q5_0 fallback),
    which held_paths returns apart: the integer family holds them at int5."""
    linears = {
        f"model.layers.{i}.{kind}": torch.nn.Linear(width, 8)
        for i in range(8)
        for kind, width in (("self_attn.q_proj", 640), ("self_attn.v_proj", 640), ("mlp.down_proj", 2048))
    } | {"lm_head": torch.nn.Linear(640, 8)}
    picked = {i for i in range(8) if more_bits(i, 8)}  # 0, 3, 6, 7
    six, five = held_paths("sensitive", linears, "model.embed_tokens", "lm_head", 8)
    expected = {f"model.layers.{i}.{k}" for i in picked for k in ("self_attn.v_proj", "mlp.down_proj")}
    assert set(six) == expected | {"lm_head", "model.embed_tokens"} and five == ()
    mixed_six, mixed_five = held_paths("mixed", linears, "model.embed_tokens", "lm_head", 8)
    assert mixed_six == six
    assert set(mixed_five) == {p for p, m in linears.items() if m.in_features % 256} - set(six)
    assert held_paths("uniform", linears, "model.embed_tokens", "lm_head", 8) == ((), ())


def test_scale_search_recovers_a_grid_and_never_fits_worse_than_the_range():
    g = torch.Generator().manual_seed(8)
    spec = QuantSpec(INT4, 32, INTEGER)
    q = torch.randint(0, 16, (64, 4, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # each group spans the whole grid
    scale = (torch.rand(64, 4, 1, generator=g) + 0.1).bfloat16().float()
    low = torch.randn(64, 4, 1, generator=g).bfloat16().float()
    on_grid = (q * scale + low).view(64, 128)
    q_found, s_found, m_found = scales.search(spec, on_grid)
    torch.testing.assert_close(
        int4.values(spec, q_found, s_found, m_found), on_grid, rtol=0, atol=1e-2 * scale.max().item()
    )
    weight = torch.randn(64, 128, generator=g) * torch.rand(64, 1, generator=g)
    weight[:, 5] *= 8  # an outlier per row
    err = {}
    for name, (q2, s2, m2) in (("mse", scales.search(spec, weight)), ("range", int4.grid(spec, weight))):
        err[name] = (int4.values(spec, q2, s2, m2) - weight).pow(2).sum().item()
    assert err["mse"] < err["range"]


@pytest.mark.parametrize(("family", "group"), [("integer", 32), ("integer", 128), ("inductor", 32)])
def test_mixed_holds_q5_0s_weights_at_int5_only_where_the_kernels_read_it(family, group):
    """`mixed` on a model of 64-wide weights: the integer family holds the weights Q4_K_M gives Q5_0 at int5,
    in groups of 32 whatever the int4 group size (Q5_0's blocks: 64 columns are not a group of 128);
    Inductor's family, which has no int5, at int8, as every `mixed` bundle did before format 16."""
    from transformers import MistralConfig, MistralForCausalLM

    from exporter.quantize import plan, quantize_model

    config = MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)  # fmt: skip
    model = MistralForCausalLM(config)
    q = plan(model, QuantSpec(INT4, group, family), "mixed", "mse")
    six = {"lm_head", "model.embed_tokens", "model.layers.1.self_attn.v_proj", "model.layers.1.mlp.down_proj"}
    held = set(q.linears) - six
    assert (set(q.int8_paths), set(q.int5_paths)) == ((six, held) if family == "integer" else (six | held, set()))
    quantize_model(model, q)
    specs = {model.get_submodule(path).packed.spec for path in held}
    assert specs == {QuantSpec("int5", 32, family) if family == "integer" else QuantSpec("int8", None, family)}
