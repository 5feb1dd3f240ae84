"""The manifest reader: property-based tests (hypothesis). Whatever the bytes, reading either returns
a Manifest or raises ManifestError; a written manifest reads back equal."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.errors import ManifestError
from runtime.format.layout import FULL, SLIDING, LayerLayout
from runtime.format.manifest import (
    FORMAT_VERSION,
    SUPPORTED_VERSIONS,
    Accuracy,
    Constant,
    DecodeAttention,
    DecodeGraph,
    Lowering,
    Manifest,
    NativeKernels,
    OnnxDecode,
    Parity,
    Quantization,
    _digest,
)
from runtime.format.summary import summary

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)

layers = st.builds(
    lambda kind, slots, heads, dim: LayerLayout(kind, slots, slots if kind == SLIDING else None, heads, dim),
    st.sampled_from([FULL, SLIDING]),
    st.integers(1, 64),
    st.integers(1, 8),
    st.integers(1, 256),
)


names = st.text(min_size=1, max_size=10)
quantizations = st.none() | st.builds(
    lambda method, kernels, linears, embedding, mixed, rates: Quantization(
        method,
        32 if method == "int4" else None,
        kernels,
        {"integer": "lanes16", "inductor": "words"}[kernels],
        tuple(linears),
        embedding,
        linears[-1] if embedding else None,
        "mixed" if mixed and method == "int4" else "uniform",
        (linears[-1], *([embedding] if embedding else [])) if mixed and method == "int4" else (),
        # the integer family's mixed int4 holds Q5_0's weights at int5
        tuple(p for p in linears[:-1][:1] if p != embedding and mixed and (method, kernels) == ("int4", "integer")),
        "mse" if method == "int4" else "minmax",
        rates,
        "the timing was noise (the export had 31% of its cores)" if rates and mixed else None,
    ),
    st.sampled_from(["int8", "int4"]),
    st.sampled_from(["integer", "inductor"]),
    st.lists(names, min_size=1, max_size=3, unique=True),
    st.none() | names,
    st.booleans(),
    st.dictionaries(names, st.floats(0, 100), max_size=2),
)
lowerings = st.builds(
    lambda op, rows, cols, rates, noisy: Lowering(
        op, rows, cols, "float32", next(iter(rates), "aten"), rates, {k: v / 200 for k, v in rates.items()}, noisy
    ),
    st.sampled_from(["linear", "int8", "int4"]),
    st.integers(1, 4096),
    st.integers(1, 4096),
    st.dictionaries(names | st.sampled_from(["dense", "tiles", "dpbf16"]), st.floats(0, 100), max_size=3),
    st.none() | st.text(max_size=20),
)
constants = st.builds(
    Constant,
    st.text(max_size=10),
    st.text(max_size=10),
    st.none() | st.text(max_size=10),
    st.sampled_from(["float32", "bfloat16"]),
    st.lists(st.integers(0, 4096), max_size=3).map(tuple),
)
parities = st.builds(Parity, st.integers(0, 100), st.floats(0, 1), st.floats(0, 1), st.booleans())
onnx_decodes = st.none() | st.builds(
    lambda opset, initializers, parity: OnnxDecode("decode.onnx", opset, "1.32.0", tuple(initializers), parity),
    st.integers(1, 30),
    st.lists(constants, max_size=3),
    parities,
)
attentions = st.none() | st.builds(
    lambda timed, span: DecodeAttention(next(iter(timed), "flash"), timed, span),
    st.dictionaries(st.sampled_from(["sdpa", "flash", "flash-fp32"]), st.floats(0, 1e4), max_size=3),
    st.integers(0, 4096),
)
accuracies = st.none() | st.builds(
    Accuracy, st.integers(1, 512), st.floats(1, 1e4), st.floats(1, 1e4), st.integers(0, 256), st.floats(0, 1)
)


@st.composite
def manifests(draw):
    drafts = draw(st.sampled_from([0, 0, 3]))  # speculative decoding: rings 3 slots wider, verify graphs of 4 tokens
    chunk = draw(st.sampled_from([0, 0, 6]))  # a chunk graph of 6 tokens: rings 5 slots wider
    layout = tuple(
        replace(layer, slots=min(layer.window + max(drafts, chunk - 1), 64)) if layer.window else layer
        for layer in draw(st.lists(layers, min_size=1, max_size=6))
    )
    dtype = draw(st.sampled_from(["float32", "bfloat16", "float16"]))
    batch = draw(st.integers(1, 64))
    onnx = draw(onnx_decodes)
    quantization = draw(quantizations)
    batches = sorted({*draw(st.lists(st.integers(1, batch), max_size=3)), batch})
    graphs = tuple(
        DecodeGraph(b, tuple(draw(st.lists(lowerings, max_size=3))), draw(parities), draw(st.floats(0, 1e4)), t)
        for t in ((1, drafts + 1) if drafts else (1,))
        for b in batches
    ) + ((DecodeGraph(1, (), draw(parities), 1.0, chunk, True),) if chunk else ())
    native = None
    chosen = {lw.chosen for g in graphs for lw in g.lowerings}
    # bf16 on AMX tiles or AVX512-BF16: a bf16 bundle, kernels built for amx or another 512-bit path
    dtype = "bfloat16" if chosen & {"tiles", "dpbf16"} else dtype
    if chosen & {"dense", "tiles", "dpbf16"} or (quantization is not None and quantization.kernels == "integer"):
        isa = "amx" if "tiles" in chosen else "avx512-vnni" if "dpbf16" in chosen else "avx2"
        native = NativeKernels("kernels.so", "libaotpack-kernels-0123456789abcdef.so", isa, 1, "g++ 12.2.0")
    return Manifest(
        format_version=FORMAT_VERSION,
        aotpack_version="0.2.0",
        torch_version=draw(st.text(min_size=1, max_size=12)),
        transformers_version="5.24.0",
        python_version="3.11.7",
        model_class=draw(st.text(min_size=1, max_size=20)),
        attn_implementation=draw(st.sampled_from(["sdpa", "eager"])),
        is_multimodal=draw(st.booleans()),
        device=draw(st.sampled_from(["cpu", "cuda"])),
        cpu_isa=draw(st.none() | st.text(max_size=20)),
        dtype=dtype,
        batch_size=batch,
        max_cache_len=64,
        vocab_size=draw(st.integers(1, 300000)),
        cache_layout=layout,
        cache_bytes=tuple(layer.nbytes(batch, dtype) for layer in layout),
        decode_inputs=("input_ids", "position_ids", "cache_position", "pad_mask"),
        constants=tuple(draw(st.lists(constants, max_size=4))),
        weight_aliases=draw(st.dictionaries(names, names, max_size=2)),
        quantization=quantization,
        graphs=graphs,
        draft_tokens=drafts,
        chunk_tokens=chunk,
        decode_attention=draw(attentions),
        accuracy=draw(accuracies),
        files={"decode.pt2": "ab" * 32}
        | ({"decode.onnx": "cd" * 32} if onnx else {})
        | ({"kernels.so": "ef" * 32} if native else {})
        | draw(st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=64), max_size=4)),
        build_seconds=draw(st.floats(0, 1e6)),
        built_at="2026-11-29T00:00:00+00:00",
        parity=draw(parities),
        onnx=onnx,
        native=native,
    )


def _with_digest(raw: dict) -> str:
    raw = {k: v for k, v in raw.items() if k != "digest"}
    return json.dumps(raw | {"digest": _digest(raw)})


@given(manifests())
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip(manifest):
    assert Manifest.from_json(manifest.to_json()) == manifest


@given(json_values)
@settings(max_examples=300)
def test_arbitrary_json_is_refused_cleanly(value):
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(value))


@given(st.binary(max_size=200))
@settings(max_examples=200)
def test_arbitrary_bytes_are_refused_cleanly(data):
    with pytest.raises(ManifestError):
        Manifest.from_json(data.decode("latin-1"))


@given(manifests(), st.data())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_any_field_replaced_by_any_json_reads_or_refuses(manifest, data):
    """Even with a valid digest (a consistent, deliberate edit), a wrong type or value is a ManifestError."""
    raw = json.loads(manifest.to_json())
    key = data.draw(st.sampled_from(sorted(k for k in raw if k != "digest")))
    raw[key] = data.draw(json_values)
    try:
        read = Manifest.from_json(_with_digest(raw))
    except ManifestError:
        return
    assert isinstance(read, Manifest)
    assert read.batch_size >= 1 and read.max_cache_len >= 1 and read.dtype in ("float32", "bfloat16", "float16")


@given(manifests(), st.integers(0, 10_000), st.integers(0, 7))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_any_flipped_bit_is_refused(manifest, position, bit):
    text = bytearray(manifest.to_json().encode())
    text[position % len(text)] ^= 1 << bit
    try:
        read = Manifest.from_json(text.decode("utf-8"))
    except (ManifestError, UnicodeDecodeError):
        return
    assert read == manifest  # only a flip JSON cannot see (e.g. inside insignificant whitespace) may pass


@given(manifests(), st.just(1) | st.just(2) | st.integers(FORMAT_VERSION + 1, 10**6))
def test_unsupported_versions_name_both(manifest, version):
    raw = json.loads(manifest.to_json()) | {"format_version": version}
    readable = ", ".join(map(str, sorted(SUPPORTED_VERSIONS)))
    with pytest.raises(ManifestError, match=f"format_version {version} .* reads \\[{readable}\\]"):
        Manifest.from_json(_with_digest(raw))


@given(manifests(), st.sampled_from([3, 4]))
@settings(max_examples=20)
def test_formats_3_and_4_are_refused_saying_why(manifest, version):
    """Their decode attends to the whole cache every step; format 5's to the span in use."""
    raw = json.loads(manifest.to_json()) | {"format_version": version}
    with pytest.raises(ManifestError, match=f"format_version {version} .its decode attends to the whole cache"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=10)
def test_format_5_is_refused_saying_why(manifest):
    """Its one graph ran batch-1 kernels at every batch; format 6 has a graph per batch bucket."""
    raw = json.loads(manifest.to_json()) | {"format_version": 5}
    with pytest.raises(ManifestError, match="format_version 5 .its decode runs batch-1 kernels at every batch"):
        Manifest.from_json(_with_digest(raw))


@given(manifests(), st.sampled_from(["drop the full batch", "repeat", "descend", "none", "zero"]))
@settings(max_examples=60)
def test_graphs_must_ascend_to_the_batch_size(manifest, edit):
    """The engine steps the smallest graph covering the rows in use, and the cache's every row must be
    covered: a graph list that does not end at batch_size, or is out of order, is refused."""
    raw = json.loads(manifest.to_json())
    graphs = [g for g in raw["graphs"] if g["tokens"] == 1]  # the decode graphs (verify graphs: below)
    raw |= {"graphs": graphs, "draft_tokens": 0}
    if edit == "drop the full batch":
        graphs.pop()
    elif edit == "repeat":
        graphs.append(graphs[-1])
    elif edit == "descend":
        graphs.insert(0, graphs[-1] | {"batch": raw["batch_size"]})
    elif edit == "none":
        graphs.clear()
    else:
        graphs.insert(0, graphs[0] | {"batch": 0})
    with pytest.raises(ManifestError, match="graphs step batches .* must ascend"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_an_onnx_entry_needs_its_listed_file(manifest):
    raw = json.loads(manifest.to_json())
    if raw["onnx"] is None:
        return
    raw["files"].pop("decode.onnx")
    with pytest.raises(ManifestError, match="not a listed decode.onnx"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=50)
def test_layer_kind_and_window_must_agree(manifest):
    raw = json.loads(manifest.to_json())
    layer = raw["cache_layout"][0]
    layer["kind"] = SLIDING if layer["kind"] == FULL else FULL  # keep the other kind's window (or lack of one)
    with pytest.raises(ManifestError, match="window goes with sliding layers only"):
        Manifest.from_json(_with_digest(raw))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1, "a": 2}', "repeats the key 'a'"),
        ('{"a": NaN}', "NaN, which is not JSON"),
        ('{"a": Infinity}', "Infinity, which is not JSON"),
        ('{"a": 1e400}', "non-finite number 1e400"),
        ("[" * 100_000 + "]" * 100_000, "RecursionError"),
        ('{"a": ' + "9" * 5000 + "}", "not valid JSON"),
        (b'{"a": "\xff"}', "UnicodeDecodeError"),
    ],
    ids=["duplicate key", "NaN", "Infinity", "overflowing float", "deep nesting", "5000 digits", "not UTF-8"],
)
def test_hostile_json_is_a_manifest_error(text, message):
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(text)


@given(manifests(), st.integers(1, 10**400))
@settings(max_examples=30)
def test_cache_bytes_must_match_the_layout(manifest, nbytes):
    raw = json.loads(manifest.to_json())
    if nbytes == raw["cache_bytes"][0]:
        return
    raw["cache_bytes"][0] = nbytes
    with pytest.raises(ManifestError, match="does not match its layer"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_format_6_reads_as_weight_only_inductor_quantization(manifest):
    """Format 6 had one kernel family (Inductor's, weight-only), one method per bundle and range scales;
    its manifests read on, without the fields format 7 added."""
    raw = _as_format_7(json.loads(manifest.to_json()))
    if raw is None or raw["native"] is not None:
        return  # format 6 had no integer kernels, nor drafts
    raw = raw | {"format_version": 6}
    if raw["native"] is not None:
        return  # format 6 had no integer kernels
    raw.pop("native")
    q = raw["quantization"]
    if q is not None:
        for key in ("kernels", "layout", "recipe", "int8_paths", "scales", "kernel_rates"):
            q.pop(key)
    read = Manifest.from_json(_with_digest(raw))
    assert read.native is None
    if read.quantization is not None:
        assert (read.quantization.kernels, read.quantization.recipe, read.quantization.scales) == (
            "inductor", "uniform", "minmax",
        )  # fmt: skip


def _as_format_7(raw: dict) -> dict:
    """A manifest as format 7 wrote it: its lowerings without `spread` and `noisy`."""
    for graph in raw["graphs"]:
        for lowering in graph["lowerings"]:
            del lowering["spread"], lowering["noisy"]
    raw = _as_format_8(raw)
    return raw and raw | {"format_version": 7}


def _as_format_8(raw: dict) -> dict:
    """A manifest as format 8 wrote it: its quantization without `kernel_noise`."""
    if raw["quantization"] is not None:
        del raw["quantization"]["kernel_noise"]
    raw = _as_format_9(raw)
    return raw and raw | {"format_version": 8}


def _as_format_11(raw: dict) -> dict | None:
    """A manifest as format 11 wrote it: no chunk graph (None for one with a chunk graph)."""
    if raw.pop("chunk_tokens"):
        return None
    for graph in raw["graphs"]:
        del graph["chunk"]
    return raw | {"format_version": 11}


def _as_format_9(raw: dict) -> dict | None:
    """A manifest as format 9 wrote it: no drafts, no graph's `tokens` (None for one with verify graphs)."""
    raw = _as_format_11(raw)
    if raw is None or raw.pop("draft_tokens"):
        return None
    for graph in raw["graphs"]:
        del graph["tokens"]
    return raw | {"format_version": 9}


@given(manifests())
@settings(max_examples=30)
def test_format_9_reads_with_no_drafts_and_decode_graphs_only(manifest):
    raw = _as_format_9(json.loads(manifest.to_json()))
    if raw is None:
        return
    read = Manifest.from_json(_with_digest(raw))
    assert read.format_version == 9 and read.draft_tokens == 0 and read.verify_batches == ()
    assert read.batches == manifest.batches


@given(manifests())
@settings(max_examples=40)
def test_verify_graphs_go_with_drafts_and_rings_wide_enough_for_them(manifest):
    """A verify graph missing for a batch, or a ring without the k slots beyond its window that rejected
    drafts need, is refused: the latter would overwrite tokens still in the window."""
    raw = json.loads(manifest.to_json())
    if not raw["draft_tokens"]:
        return
    assert Manifest.from_json(manifest.to_json()).verify_batches == manifest.batches
    dropped = raw | {"graphs": [g for g in raw["graphs"] if not (g["tokens"] > 1 and g["batch"] == raw["batch_size"])]}
    with pytest.raises(ManifestError, match="do not match draft_tokens"):
        Manifest.from_json(_with_digest(dropped))
    rings = [layer for layer in raw["cache_layout"] if layer["window"] and layer["window"] < 61]
    if rings:
        rings[0]["slots"] = rings[0]["window"]
        raw["cache_bytes"] = [LayerLayout(**la).nbytes(raw["batch_size"], raw["dtype"]) for la in raw["cache_layout"]]
        with pytest.raises(ManifestError, match="lacks the 3 slots beyond its window"):
            Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_format_11_reads_without_a_chunk_graph(manifest):
    raw = _as_format_11(json.loads(manifest.to_json()))
    if raw is None:
        return
    read = Manifest.from_json(_with_digest(raw))
    assert read.format_version == 11 and read.chunk_tokens == 0 and not any(g.chunk for g in read.graphs)
    assert (read.batches, read.verify_batches) == (manifest.batches, manifest.verify_batches)


@given(manifests())
@settings(max_examples=40)
def test_the_chunk_graph_goes_with_chunk_tokens_and_rings_wide_enough_for_it(manifest):
    """One chunk graph of one row and C tokens, exactly when chunk_tokens is C, and rings C - 1 slots
    beyond their window: narrower, the chunk's last token would overwrite a key its first still reads."""
    raw = json.loads(manifest.to_json())
    if not raw["chunk_tokens"]:
        with pytest.raises(ManifestError, match="do not match chunk_tokens"):
            graph = dict(raw["graphs"][0]) | {"batch": 1, "tokens": 6, "chunk": True}
            Manifest.from_json(_with_digest(raw | {"graphs": raw["graphs"] + [graph]}))
        return
    read = Manifest.from_json(manifest.to_json())
    chunks = [g for g in read.graphs if g.chunk]
    assert read.chunk_tokens == 6 and [(g.batch, g.tokens) for g in chunks] == [(1, 6)]
    # the chunk graph is no batch bucket (a bucket of 6 rows may stand beside it)
    assert read.batches == tuple(sorted({g.batch for g in read.graphs if not g.chunk and g.tokens == 1}))
    for bad in (0, 1, 7, 65, True):
        with pytest.raises(ManifestError, match="chunk"):
            Manifest.from_json(_with_digest(raw | {"chunk_tokens": bad}))
    with pytest.raises(ManifestError, match="do not match chunk_tokens"):
        Manifest.from_json(_with_digest(raw | {"graphs": [g for g in raw["graphs"] if not g["chunk"]]}))
    rings = [layer for layer in raw["cache_layout"] if layer["window"] and layer["window"] + 5 <= 64]
    if rings and not raw["draft_tokens"]:
        rings[0]["slots"] = rings[0]["window"] + 4
        raw["cache_bytes"] = [LayerLayout(**la).nbytes(raw["batch_size"], raw["dtype"]) for la in raw["cache_layout"]]
        with pytest.raises(ManifestError, match="lacks the 5 slots beyond its window"):
            Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_format_8_reads_with_its_kernel_family_as_chosen(manifest):
    raw = _as_format_8(json.loads(manifest.to_json()))
    if raw is None:
        return
    read = Manifest.from_json(_with_digest(raw))
    assert read.format_version == 8
    if read.quantization is not None:
        assert read.quantization.kernel_noise is None
        assert read.quantization.kernel_rates == manifest.quantization.kernel_rates


@given(manifests())
@settings(max_examples=30)
def test_format_7_reads_with_its_timings_as_they_were(manifest):
    """Format 7 recorded no timing spread: its lowerings read on, their choices standing, none noisy."""
    raw = _as_format_7(json.loads(manifest.to_json()))
    if raw is None:
        return
    read = Manifest.from_json(_with_digest(raw))
    assert read.format_version == 7
    lowerings = [lw for g in read.graphs for lw in g.lowerings]
    assert [(lw.chosen, lw.gb_per_s) for lw in lowerings] == [
        (lw.chosen, lw.gb_per_s) for g in manifest.graphs for lw in g.lowerings
    ]
    assert all(lw.spread == {} and lw.noisy is None for lw in lowerings)


@given(manifests())
@settings(max_examples=20)
def test_a_lowering_whose_noise_is_not_text_is_refused(manifest):
    raw = json.loads(manifest.to_json())
    lowerings = [lw for graph in raw["graphs"] for lw in graph["lowerings"]]
    if not lowerings:
        return
    lowerings[0]["noisy"] = 3
    with pytest.raises(ManifestError, match="noisy must be a string or null"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_integer_kernels_and_their_library_go_together(manifest):
    raw = json.loads(manifest.to_json())
    if raw["native"] is not None:
        raw["files"].pop("kernels.so")
        message = "not a listed kernels.so"
    elif raw["quantization"] is not None:
        raw["quantization"] |= {"kernels": "integer", "layout": "lanes16"}
        message = "integer kernels, `dense` lowerings and the native decode attention need `native`"
    else:
        return
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_dense_lowerings_and_the_kernels_library_go_together(manifest):
    """A graph that chose aotpack's dense GEMM needs the bundle's kernels.so; a float bundle whose graphs
    call nothing of it carries none."""
    raw = json.loads(manifest.to_json())
    lowerings = [lw for graph in raw["graphs"] for lw in graph["lowerings"]]
    integer = raw["quantization"] is not None and raw["quantization"]["kernels"] == "integer"
    if not lowerings or integer:
        return
    kernels = any(lw["chosen"] in ("dense", "tiles", "dpbf16") for lw in lowerings)
    for lw in lowerings:
        lw["chosen"] = "aten" if kernels else "dense"
        lw["gb_per_s"], lw["spread"] = {}, {}  # untimed (--gemv aten or dense)
    with pytest.raises(ManifestError, match="need `native`, and only they"):
        Manifest.from_json(_with_digest(raw))


@given(manifests(), st.sampled_from(["dtype", "isa"]))
@settings(max_examples=30)
def test_a_tiles_lowering_needs_a_bf16_bundle_with_kernels_built_for_amx(manifest, wrong):
    """`tiles` multiplies bf16 on AMX tiles: a float16 bundle (its cache the same size), or kernels built
    for another path, is refused."""
    raw = json.loads(manifest.to_json())
    if not any(lw["chosen"] == "tiles" for graph in raw["graphs"] for lw in graph["lowerings"]):
        return
    assert Manifest.from_json(_with_digest(raw)).native.isa == "amx"
    if wrong == "dtype":
        raw["dtype"] = "float16"
    else:
        raw["native"]["isa"] = "avx512-vnni"
    with pytest.raises(ManifestError, match="lowering 'tiles' runs bf16 on AMX tiles"):
        Manifest.from_json(_with_digest(raw))


@given(manifests(), st.sampled_from(["dtype", "isa"]))
@settings(max_examples=30)
def test_a_dpbf16_lowering_needs_a_bf16_bundle_with_kernels_built_for_a_512_bit_path(manifest, wrong):
    """`dpbf16` multiplies bf16 with AVX512-BF16: a float16 bundle, or kernels built for AVX2 (no build of
    which has the instruction), is refused."""
    raw = json.loads(manifest.to_json())
    chosen = {lw["chosen"] for graph in raw["graphs"] for lw in graph["lowerings"]}
    if "dpbf16" not in chosen or "tiles" in chosen:  # a `tiles` beside it is refused first, for its own reason
        return
    assert Manifest.from_json(_with_digest(raw)).native.isa in ("avx512-vnni", "amx")
    if wrong == "dtype":
        raw["dtype"] = "float16"
    else:
        raw["native"]["isa"] = "avx2"
    with pytest.raises(ManifestError, match="lowering 'dpbf16' runs bf16 with AVX512-BF16"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_the_native_decode_attention_and_the_kernels_library_go_together(manifest):
    """A bundle whose decode attention is aotpack's kernel needs the bundle's kernels.so."""
    raw = json.loads(manifest.to_json())
    if raw["native"] is not None:  # the drawn bundle needs them already (integer kernels, dense lowerings)
        raw["decode_attention"] = {"chosen": "native", "us_per_call": {}, "span": 0}
        assert Manifest.from_json(_with_digest(raw)).decode_attention.chosen == "native"
        return
    raw["decode_attention"] = {"chosen": "native", "us_per_call": {"native": 3.0, "flash": 5.0}, "span": 64}
    with pytest.raises(ManifestError, match="need `native`, and only they"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_int8_paths_belong_to_a_mixed_int4_bundle(manifest):
    raw = json.loads(manifest.to_json())
    if raw["quantization"] is None:
        return
    raw["quantization"]["int8_paths"] = ["not.a.quantized.module"]
    with pytest.raises(ManifestError, match="int8_paths must be quantized modules of a mixed int4 bundle"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_int5_paths_belong_to_a_mixed_int4_bundle_of_the_integer_kernels(manifest):
    """int5 weights: quantized modules, none also at int8, in a mixed int4 bundle whose kernels read int5
    (Inductor's have none); a tied lm_head and its embedding at one method."""
    raw = json.loads(manifest.to_json())
    q = raw["quantization"]
    if q is None:
        return
    reads_int5 = q["method"] == "int4" and q["recipe"] == "mixed" and q["kernels"] == "integer"
    held = [p for p in q["linears"] if p not in q["int8_paths"] and p != q["tied"]][:1]
    cases = (
        [(held, "int5_paths belong to a mixed int4 bundle of the integer kernels")]
        if not reads_int5
        else [
            (["not.a.quantized.module"], "int5_paths must be quantized modules not among int8_paths"),
            (q["int8_paths"][:1], "int5_paths must be quantized modules not among int8_paths"),
        ]
    )
    if reads_int5 and q["tied"]:
        cases.append(([q["tied"]], "tied lm_head and its embedding at different methods"))  # the embedding: int8
    for paths, why in (case for case in cases if case[0]):
        bad = q | {"int5_paths": paths}
        if "tied" in why:  # the lm_head leaves int8 for int5, its embedding stays
            bad["int8_paths"] = [p for p in q["int8_paths"] if p != q["tied"]]
        with pytest.raises(ManifestError, match=why):
            Manifest.from_json(_with_digest(raw | {"quantization": bad}))


@given(manifests())
@settings(max_examples=20)
def test_a_format_15_manifest_reads_with_no_int5_weight(manifest):
    raw = json.loads(manifest.to_json())
    if raw["quantization"] is None:
        return
    raw["quantization"].pop("int5_paths")
    read = Manifest.from_json(_with_digest(raw | {"format_version": 15}))
    assert read.quantization.int5_paths == () and read.format_version == 15
    for path in read.quantization.linears:
        assert read.quantization.spec(path).method != "int5"


@given(manifests())
@settings(max_examples=20)
def test_a_layout_the_kernels_do_not_read_is_refused(manifest):
    """Among them the integer family's earlier layout (tiles of four rows), which bundles exported before
    the 16-lane kernels carry."""
    raw = json.loads(manifest.to_json())
    if raw["quantization"] is None:
        return
    raw["quantization"]["layout"] = "tiles4"
    with pytest.raises(ManifestError, match="layout 'tiles4' is not the .* re-export"):
        Manifest.from_json(_with_digest(raw))


@given(manifests())
@settings(max_examples=30)
def test_inspect_names_what_calls_the_kernels_library(manifest):
    """`aotpack inspect` names aotpack's kernels where the integer family, a `dense` lowering or the native
    attention calls them, and only there: a bundle carrying kernels.so for its attention alone keeps
    Inductor's quantized reductions and shows no dense GEMM."""
    native = manifest.native or NativeKernels("kernels.so", "libaotpack-kernels-0.so", "avx2", 1, "g++ 12.2.0")
    text = summary(replace(manifest, decode_attention=DecodeAttention("native", {}, 0), native=native))
    q, isa = manifest.quantization, native.isa
    if q is not None:
        assert ("Inductor's dequantizing reductions" in text) == (q.kernels != "integer")
        assert (f"aotpack's {isa} kernels (kernels.so" in text) == (q.kernels == "integer")
    chosen = {lw.chosen for g in manifest.graphs for lw in g.lowerings}
    assert (f"  dense: aotpack's GEMM (kernels.so, built for {isa}" in text) == ("dense" in chosen)
    assert (f"  tiles: aotpack's bf16 GEMM on AMX tiles (kernels.so, built for {isa}" in text) == ("tiles" in chosen)
    assert (f"  dpbf16: aotpack's bf16 GEMM with AVX512-BF16 (kernels.so, built for {isa}" in text) == (
        "dpbf16" in chosen
    )
    assert f"attention    native (aotpack's {isa} kernel, kernels.so) (untimed)" in text
