"""The GEMV tuning's timing, with no bundle: candidates timed in turn, each one's fastest call kept, and a
timing judged noise (busy cores, or calls that scatter) keeping the known-good candidate instead of
whatever happened to win. Real kernels under a real competing load: `test_tuning_holds_under_load`."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

from exporter.compile import kernel_options
from exporter.lowering import (
    BUSY_CPU_SHARE,
    LINEAR,
    NOISY_SPREAD,
    WeightShape,
    gb_per_s,
    kept,
    known_good,
    noise_of,
    tune,
)
from exporter.timing import Interleaved, held_as_loaded, interleaved_seconds

TIMED_FILE = "timed.safetensors (deleted)"  # exporter.timing.held_as_loaded's file, unlinked once mapped


def _mapped_file(tensor: torch.Tensor) -> str:
    """The file whose mapping holds `tensor`'s first byte ("" for anonymous memory, the heap's included),
    from /proc/self/maps."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, _, _, _, _, *path = line.split(maxsplit=5)
            start, end = (int(a, 16) for a in span.split("-"))
            if start <= address < end:
                return path[0].strip() if path and not path[0].startswith("[") else ""
    raise AssertionError(f"no mapping holds {address:#x}")


def test_timed_weights_are_held_as_the_runtime_holds_a_bundles():
    """The timings' weights live where a loaded bundle's do (a file's mapping, runtime.model.weights):
    which build of the integer kernels is faster depends on it. The values and order are kept."""
    tensors = [torch.randint(0, 256, (64, 32), dtype=torch.uint8), torch.rand(64), torch.rand(3, 5).t()]
    held = held_as_loaded(tensors)
    assert [(h.dtype, h.shape) for h in held] == [(t.dtype, t.shape) for t in tensors]
    assert all(torch.equal(h, t) for h, t in zip(held, tensors, strict=True))
    assert [_mapped_file(h).endswith(TIMED_FILE) for h in held] == [True] * 3
    assert [_mapped_file(t) for t in tensors] == [""] * 3  # fresh allocations: anonymous memory


def test_every_timing_times_held_weights_written_once_an_export(monkeypatch):
    """The GEMV tuning (tune) and the families' race (race) time weights held as a bundle's, fresh
    activations at each batch, and a shape's weight is written once for all the graphs of an export
    (forget_timed_weights lets them go)."""
    from exporter import lowering

    monkeypatch.setattr(lowering, "_TIMED_BYTES", 1 << 16)  # a unit test writes kilobytes, not 96 MB
    monkeypatch.setattr(lowering, "KNOWN_GOOD", {})
    timed, held = [], []
    monkeypatch.setattr(lowering, "held_as_loaded", lambda tensors: held.append(tensors) or held_as_loaded(tensors))

    def interleaved(fns, *args, threads):
        timed.append(args or [a for fn in fns.values() for a in fn.args])  # tune passes them; race binds them
        return Interleaved({name: 1e-3 for name in fns}, {name: 0.0 for name in fns}, 1.0)

    monkeypatch.setattr(lowering, "interleaved_seconds", interleaved)
    lowering.forget_timed_weights()
    shape = WeightShape("int4-dot", 64, 64, 32)
    for batch in (1, 4):
        tune([shape], torch.float32, "cpu", {}, batch, log=lambda _: None)
        lowering.race({"a": (shape, lambda *a: None, {})}, torch.float32, "cpu", batch)
    x, *weight, group = timed[0]
    assert [t.shape[0] for t in (args[0] for args in timed)] == [1, 1, 4, 4] and group == 32  # x: (batch, 1, K)
    assert _mapped_file(x) == "" and len(weight) == 3  # codes, scales, mins
    assert all(_mapped_file(t).endswith(TIMED_FILE) for args in timed for t in args[1:4])
    assert len(held) == 1 and all(args[1] is weight[0] for args in timed)  # written once, shared
    lowering.forget_timed_weights()
    tune([shape], torch.float32, "cpu", {}, 1, log=lambda _: None)
    assert len(held) == 2 and timed[-1][1] is not weight[0]  # forgotten: written again
    lowering.forget_timed_weights()


def _sleeper(seconds: float, calls: list[str], name: str):
    def fn():
        calls.append(name)
        time.sleep(seconds)

    return fn


def test_candidates_are_timed_in_turn_and_their_fastest_call_kept():
    calls: list[str] = []
    fns = {"slow": _sleeper(0.004, calls, "slow"), "fast": _sleeper(0.001, calls, "fast")}
    timed = interleaved_seconds(fns, threads=1, rounds=4, calls=2)
    assert calls[:2] == ["slow", "fast"]  # one warming call each
    rounds = [calls[2 + 4 * r : 6 + 4 * r] for r in range(4)]
    assert rounds == [["slow"] * 2 + ["fast"] * 2, ["fast"] * 2 + ["slow"] * 2] * 2  # turns, reversed each round
    assert 0.004 <= timed.best["slow"] < 0.004 + 0.003 and 0.001 <= timed.best["fast"] < 0.001 + 0.003
    assert all(s >= 0 for s in timed.spread.values())
    assert timed.cpu_share < BUSY_CPU_SHARE  # sleeping is not running: this process left its core idle


def test_the_spread_is_the_median_call_over_the_fastest(monkeypatch):
    """On a clock that only the calls move (a real sleep overshoots on a busy machine)."""
    import types

    from exporter import timing

    now, times = [0.0], iter([0.0, 0.002, 0.002, 0.004, 0.008])  # the warming call, then four timed calls

    def fn():
        now[0] += next(times)

    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0], process_time=lambda: 0.0))
    timed = interleaved_seconds({"only": fn}, threads=1, rounds=2, calls=2)
    assert timed.spread["only"] == pytest.approx(0.003 / 0.002 - 1)  # median 3 ms over 2 ms


def _timed(spread: float, share: float, reduce_best: float = 1.1) -> Interleaved:
    best, spreads = {"aten": 1.0, "reduce": reduce_best}, {"aten": 0.01, "reduce": spread}
    return Interleaved(best=best, spread=spreads, cpu_share=share)


@pytest.mark.parametrize(
    ("spread", "share", "noisy"),
    [(0.05, 0.7, None), (NOISY_SPREAD + 0.01, 0.7, "reduce's median call 21% over"), (0.05, 0.3, "had 30% of")],
)
def test_noise_is_a_scattered_candidate_or_busy_cores(spread, share, noisy):
    reason = noise_of(_timed(spread, share))
    assert reason is None if noisy is None else noisy in reason


@pytest.mark.parametrize(("reduce_best", "noisy"), [(1.1, True), (1.4, True), (1.6, False), (3.0, False)])
def test_a_scattered_loser_is_noise_only_if_its_scatter_could_have_made_it_win(reduce_best, noisy):
    """`reduce` 50 % scattered: its fastest call, if slowed by as much, could have been 1.1 / 1.5 or
    1.4 / 1.5 of `aten`'s (noise) but not 1.6 / 1.5 or 3.0 / 1.5 (the choice stands: `aten`)."""
    assert (noise_of(_timed(0.5, 0.7, reduce_best)) is not None) == noisy


def test_a_scattered_winner_is_notnoise_of():
    """Scatter only slows a call down: the winner's lead can only have been larger."""
    timed = Interleaved(best={"aten": 1.0, "reduce": 1.05}, spread={"aten": 0.8, "reduce": 0.02}, cpu_share=0.7)
    assert noise_of(timed) is None


def test_noise_keeps_aotpacks_own_gemm_where_the_export_has_it():
    """The known-good candidate of a float weight: `dpbf16` (bf16 weights, where it runs), else `dense`, else
    the fused reduction (an export without aotpack's kernels); a quantized scheme keeps its first."""
    assert known_good(LINEAR, {"aten": 1, "reduce": 2, "dense": 3, "tiles": 4, "dpbf16": 5}) == "dpbf16"
    assert known_good(LINEAR, {"aten": 1, "reduce": 2, "dense": 3, "tiles": 4}) == "dense"
    assert known_good(LINEAR, {"aten": 1, "reduce": 2}) == "reduce"
    assert known_good(LINEAR, {"aten": 1}) == "aten"
    assert known_good("int8", {"woq": 1, "dot": 2}) == "woq"


@pytest.mark.parametrize(
    ("reduce_best", "share", "chosen"), [(3.0, 0.7, "dense"), (0.95, 0.7, "reduce"), (3.0, 0.3, "reduce")]
)
def test_noise_keeps_the_known_good_candidate_only_where_it_could_have_won(reduce_best, share, chosen):
    """`aten` 40 % scattered beside a faster `dense`: noise. The known-good `reduce` is kept where its
    scatter could have made it win, or where the cores were busy (every timing suspect); a clear loser
    is not, and the fastest stands."""
    best = {"aten": 1.0, "reduce": reduce_best, "dense": 0.9}
    timed = Interleaved(best=best, spread={"aten": 0.4, "reduce": 0.1, "dense": 0.02}, cpu_share=share)
    noisy = noise_of(timed)
    assert noisy is not None and kept(timed, noisy, "reduce") == chosen
    assert kept(Interleaved(best=best, spread=dict.fromkeys(best, 0.01), cpu_share=0.7), None, "reduce") == "dense"


def test_a_cuda_export_is_not_judged_by_its_idle_cpu_threads():
    assert noise_of(_timed(0.05, 0.12), cpu=False) is None
    assert "reduce's median call" in noise_of(_timed(0.5, 0.12), cpu=False)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.slow
def test_tuning_holds_under_load():
    """The same shape tuned idle and beside two busy processes (as many as this machine's cores here):
    either the same candidate wins, or the loaded timing is judged noise and keeps the known-good one."""
    shape = WeightShape(LINEAR, 2048, 576)
    options = kernel_options("cpu", "native", dequantizing=False)
    (idle,) = tune([shape], torch.float32, "cpu", options, batch=1, log=lambda _: None)
    context = multiprocessing.get_context("spawn")
    loads = [context.Process(target=_busy, args=(120,)) for _ in range(max(2, torch.get_num_threads()))]
    for p in loads:
        p.start()
    try:
        time.sleep(0.5)
        (loaded,) = tune([shape], torch.float32, "cpu", options, batch=1, log=lambda _: None)
    finally:
        for p in loads:
            p.terminate()
            p.join()
    assert loaded.chosen == idle.chosen or (loaded.noisy and loaded.chosen == known_good(LINEAR, loaded.gb_per_s)), (
        idle,
        loaded,
    )
    assert idle.spread.keys() == idle.gb_per_s.keys()


NOISE = "the timing was noise (the export had 31% of its cores)"


@pytest.mark.parametrize(
    ("size", "seconds", "rate"),
    [(4096, 0.002, 0.002048), (12_345_678, 0.001, 12.35), (96 << 20, 0.003, 33.55), (1, 1.0, 1e-09)],
)
def test_rates_keep_four_figures_and_a_slow_tiny_weight_is_not_zero(size, seconds, rate):
    """The races compare 1 / rate: two decimals made a tiny model's 4 KB weight 0 GB/s on a slow machine
    (CI: ZeroDivisionError in the builds' race)."""
    assert gb_per_s(size, seconds) == rate


@pytest.mark.parametrize("noisy_race", [None, "families", "builds", "builds once"])
def test_the_kernel_families_and_the_integer_builds_are_raced_and_noise_keeps_the_known_good_ones(
    monkeypatch, noisy_race
):
    """`--quant-kernels auto` (exporter.quant_family): the integer kernels' two builds (several tiles or one
    a pass) raced over every quantized layer's weight in turn, the faster one serving the eager op; then
    each family's fastest candidate raced against the other's, at batch 1 and at the bundle's batch; the
    faster totals win unless a race stays noise in RACES runs, which keeps the known-good build or family
    ("builds once": noise, then a clean run, which counts)."""
    from types import SimpleNamespace

    from exporter import quant_family
    from exporter.config import ExportConfig
    from runtime.format.quant import INDUCTOR, INTEGER

    raced = []
    build_rates = {"tiles": 2.0, "one-tile": 4.0}

    def timed(kind, batch, entrants, rates):
        again = (kind, batch) in [(k, b) for k, b, _ in raced]
        raced.append((kind, batch, entrants))
        noisy = noisy_race is not None and noisy_race.startswith(kind) and batch == 2
        return rates, NOISE if noisy and not (again and noisy_race == "builds once") else None

    def race(entrants, dtype, device, batch):
        shapes = {name: shape.op for name, (shape, _, _) in entrants.items()}
        return timed("families", batch, shapes, {INTEGER: 3.0, INDUCTOR: 5.0})

    def race_step(libraries, weights, dtype, batch):  # every layer's weight, held as a bundle's are
        assert [(cols, operands[0].shape) for _, cols, operands, _ in weights] == [(32, (64, 32)), (32, (128, 32))]
        assert all(_mapped_file(t).endswith(TIMED_FILE) for _, _, operands, _ in weights for t in operands)
        return timed("builds", batch, libraries, build_rates)

    builds = {one: SimpleNamespace(library=f"{name} library") for name, one in quant_family.BUILDS.items()}
    registered = []
    monkeypatch.setattr(quant_family, "race", race)
    monkeypatch.setattr(quant_family, "_race_step", race_step)
    monkeypatch.setattr(quant_family, "fastest", lambda shape, *a, **k: "first")
    monkeypatch.setattr(quant_family.kernels, "build", lambda isa, log, serve, one_tile: builds[one_tile])
    monkeypatch.setattr(quant_family.native, "register", registered.append)
    config = ExportConfig(model="tiny-llama", out="unused", quantize="int8", batch_size=2)
    spec = config.quant_spec(INTEGER)
    plan = type(
        "Plan", (), {"method": "int8", "group_size": None, "linears": ("a", "b"), "spec": lambda self, path: spec}
    )
    family = quant_family.choose(config, plan(), {"a": (64, 32), "b": (128, 32)}, log=lambda _: None)
    runs = {None: (1, 1), "families": (1, quant_family.RACES), "builds": (quant_family.RACES, 1), "builds once": (2, 1)}
    builds_at_2, families_at_2 = runs[noisy_race]
    assert [(kind, batch) for kind, batch, _ in raced] == [
        ("builds", 1),
        *[("builds", 2)] * builds_at_2,
        ("families", 1),
        *[("families", 2)] * families_at_2,
    ]
    assert raced[0][2] == {name: f"{name} library" for name in quant_family.BUILDS}
    assert raced[1 + builds_at_2][2] == {INTEGER: "int8-dot", INDUCTOR: "int8"}
    build = "tiles" if noisy_race == "builds" else "one-tile"
    assert registered == [f"{build} library"]
    assert family.rates == {f"{name}@{batch}": rate for batch in (1, 2) for name, rate in
                            {INTEGER: 3.0, INDUCTOR: 5.0, **build_rates}.items()}  # fmt: skip
    assert family.kernels == (quant_family.KNOWN_GOOD if noisy_race == "families" else INDUCTOR)
    assert family.built is (builds[quant_family.BUILDS[build]] if family.kernels == INTEGER else None)
    assert (
        family.noise
        == {
            None: None,
            "families": f"at batch 2, {NOISE}",
            "builds": f"integer builds at batch 2, {NOISE}: kept tiles",
            "builds once": None,
        }[noisy_race]
    )


@pytest.mark.parametrize(
    ("dtype", "tiles", "dpbf16", "own"),
    [
        ("bfloat16", False, True, {"dense", "dpbf16"}),
        ("bfloat16", True, True, {"dense", "tiles", "dpbf16"}),
        ("bfloat16", True, False, {"dense", "tiles"}),
        ("float32", True, True, {"dense"}),  # both multiply bf16 only
        ("float16", False, True, {"dense"}),
    ],
)
def test_the_race_offers_each_bf16_gemm_where_its_instructions_run(dtype, tiles, dpbf16, own):
    from types import SimpleNamespace

    from exporter.export import _own

    native = SimpleNamespace(library=SimpleNamespace(tiles=tiles, dpbf16=dpbf16))
    assert _own(SimpleNamespace(dtype=dtype), native) == own
    assert _own(SimpleNamespace(dtype=dtype), None) == frozenset()
