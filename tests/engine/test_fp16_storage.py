"""FP16-stored weights, FP32 compute: the level term uses the exact sums, and what storage still moves is warned.

A zero-sum filter on price levels is where FP16 storage hurts: rounding its taps shifts their sum, and
level x (rounded sum - true sum) reached every output (1.17x a random zero-sum dense conv's own output
scale on a price walk). The engines add the level back with the sums of the weights as given and
re-centre the first stage block by block; the rest is measured on the first chunk and warned.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import tsconv
from tsconv.errors import TsconvWarning
from tsconv.kernels.conv1d import conv1d
from tsconv.kernels.reference import pipeline_reference
from tsconv.pipeline.spec import pipeline_from_dict, resolve

from ..helpers import price_series

C, O, K = 32, 16, 5


def _zero_sum_dense(seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).normal(size=(O, C, K)).astype(np.float32)
    return w - w.mean(axis=2, keepdims=True)  # zero-sum per filter and channel: a difference of prices


def _run(x: np.ndarray, pipe: dict, **kw) -> tuple[np.ndarray, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = tsconv.features(x, pipe, **kw)
    return y, [str(w.message) for w in caught if issubclass(w.category, TsconvWarning)]


def _relative_error(y: np.ndarray, x: np.ndarray, pipe: dict) -> float:
    """The worst output's largest error against float64 with the weights as given, over its scale."""
    exact = {**pipe, "weight_dtype": "float32"}
    if "head" in pipe:
        exact["head"] = {**pipe["head"], "weight_dtype": "float32"}
    ref = pipeline_reference(x, resolve(pipeline_from_dict(exact), [f"f{j}" for j in range(x.shape[1])]))
    ok = np.isfinite(ref)
    scale = np.where(ok, np.abs(ref), 0).max(axis=0)
    return float((np.where(ok, np.abs(y - ref), 0).max(axis=0) / scale).max())


@pytest.mark.parametrize("chunk", [1024, 65536])
def test_a_zero_sum_dense_conv_with_fp16_storage_stays_within_1e_3_of_its_scale(chunk):
    x = price_series(20000, C, seed=3)
    pipe = {"conv": [{"weights": _zero_sum_dense()}]}
    y, warned = _run(x, pipe, chunk=chunk)
    actual = _relative_error(y, x, pipe)
    assert actual < 1e-3  # 1.17 when the level term used the rounded sums
    # 7.7e-4 on the rows the check measures: above half of 1e-3, so warned, with the figure of those rows
    assert len(warned) == 1 and actual / 2 <= _figure(warned[0]) <= 2 * actual, (actual, warned)


def test_averages_of_prices_with_rounded_weights_stay_exact_to_float32():
    x = price_series(5000, 4, seed=4)
    pipe = {"conv": [{"filters": ["ma:5", "ma:10", "ema:6", "dev:10"]}]}
    y, warned = _run(x, pipe, chunk=512)
    assert warned == []
    ref = pipeline_reference(
        x, resolve(pipeline_from_dict({**pipe, "weight_dtype": "float32"}), [f"f{j}" for j in range(4)])
    )
    # 0.2 stored as 0.19995 shifted a 5-step mean of prices near 100 by 0.024 before
    assert np.nanmax(np.abs(y - ref)) < 1e-4


def test_a_zero_sum_head_over_price_levels_is_warned_with_its_error():
    x = price_series(4000, 2 * C, seed=5)
    head = np.random.default_rng(1).normal(size=(4 * C, 3))
    pipe = {"conv": [{"filters": ["ma:16", "ma:4"]}], "head": {"weights": head - head.mean(axis=0)}}
    y, warned = _run(x, pipe, chunk=1024)
    assert len(warned) == 1 and "[head]: storing its weights as float16 moves output" in warned[0]
    said = float(warned[0].split("by up to ")[1].split(" ")[0])
    actual = _relative_error(y, x, pipe)
    # the warning measures what happens (on its sample of the first chunk)
    assert actual > 1e-3 and actual / 4 <= said <= 4 * actual


def test_no_check_and_no_warning_where_storage_is_exact_or_float32():
    x = price_series(3000, C, seed=6)
    for pipe in (
        {"conv": [{"weights": _zero_sum_dense(), "weight_dtype": "float32"}]},
        {"conv": [{"filters": ["diff:1", "dev:32", "ma:16"]}]},  # exact in float16: nothing to measure
        None,  # the default pipeline
    ):
        _, warned = _run(x, pipe, chunk=1024)
        assert warned == []


def test_a_later_stage_that_storage_moves_is_named():
    x = price_series(4000, 4, seed=7)
    w2 = np.random.default_rng(2).normal(size=(3, 8, 3))
    pipe = {"conv": [{"filters": ["ma:16", "ma:8"]}, {"name": "mix", "weights": w2 - w2.mean(axis=(1, 2), keepdims=True)}]}  # fmt: skip
    _, warned = _run(x, pipe, chunk=1024)
    assert len(warned) == 1 and "[[conv]] #2 (mix): storing its weights as float16" in warned[0]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                    reason="tsconv's conv1d runs on the GPU or under the interpreter")  # fmt: skip
def test_conv1d_adds_the_level_back_with_the_given_tap_sums():
    rng = np.random.default_rng(8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.from_numpy(price_series(300, 16, seed=8).T.copy())[None].to(dev)
    w = rng.normal(size=(16, 16, 3))
    w -= w.mean(axis=2, keepdims=True)
    w16 = torch.from_numpy(w).to(dev, torch.float16)
    exact = torch.from_numpy(w.sum(axis=2)).to(dev)  # zeros, up to float64 rounding
    ref = torch.nn.functional.conv1d(x.double(), torch.from_numpy(w).to(dev))
    plain = conv1d(x, w16, padding="valid", recenter=True)
    given = conv1d(x, w16, padding="valid", recenter=True, tap_sums=exact)
    scale = ref.abs().max()
    assert (given.double() - ref).abs().max() < (plain.double() - ref).abs().max() / 4
    assert (given.double() - ref).abs().max() / scale < 3e-3  # what remains: the drift within a tile
    with pytest.raises(tsconv.TsconvError, match="tap_sums is for recenter=True"):
        conv1d(x, w16, padding="valid", tap_sums=exact)
    with pytest.raises(tsconv.TsconvError, match="tap_sums must be a contiguous float64"):
        conv1d(x, w16, padding="valid", recenter=True, tap_sums=exact.float())


# ------------------------------------------------------------------- price levels 20 to 500, by kind

WIDE = 32


def _levels_20_to_500(rows: int, seed: int) -> np.ndarray:
    """Tick-grid random walks, one feature per level from 20 to 500 (geometric), float32."""
    rng = np.random.default_rng(seed)
    start = np.round(np.geomspace(20, 500, WIDE) * 100) / 100
    steps = rng.choice([-1, 0, 0, 0, 1], size=(rows, WIDE)) * 0.01
    return (start + np.cumsum(steps, axis=0)).astype(np.float32)


def _zero_sum(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    w = rng.normal(size=shape).astype(np.float32)
    return w - w.mean(axis=-1, keepdims=True)  # zero-sum per filter and channel (float32: a user's .npy)


def _by_kind(kind: str, seed: int, tmp_path) -> tuple[object, dict, str]:
    """(pipeline as tsconv.features takes it, the same as a dict, the name its warning must carry)."""
    rng = np.random.default_rng(100 + seed)
    if kind == "dense_npy":  # weights from a .npy file through a pipeline file, default weight_dtype
        np.save(tmp_path / "w.npy", _zero_sum(rng, (16, WIDE, 5)))
        (tmp_path / "p.toml").write_text('[[conv]]\nname = "spread"\nweights = "w.npy"\n')
        pipe = {"conv": [{"name": "spread", "weights": np.load(tmp_path / "w.npy")}]}
        return tmp_path / "p.toml", pipe, "[[conv]] #1 (spread)"
    if kind == "grouped":
        pipe = {"conv": [{"name": "spread", "weights": _zero_sum(rng, (16, WIDE // 4, 5)), "groups": 4}]}
        return pipe, pipe, "[[conv]] #1 (spread)"
    if kind == "depthwise":
        pipe = {"conv": [{"name": "spread", "weights": _zero_sum(rng, (2 * WIDE, 1, 4)), "groups": WIDE}]}
        return pipe, pipe, "[[conv]] #1 (spread)"
    head = _zero_sum(rng, (3, 2 * WIDE)).T.copy()  # zero-sum over its inputs
    bank = ["ma:16", "ma:4"] if kind == "head_over_means" else ["diff:1", "dev:16"]
    pipe = {"conv": [{"filters": bank}], "head": {"weights": head}}
    return pipe, pipe, "[head]"


def _figure(message: str) -> float:
    return float(message.split("by up to ")[1].split(" ")[0])


KINDS = ["dense_npy", "grouped", "depthwise", "head_over_means", "head_over_differences"]


@pytest.mark.parametrize("seed", [0, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_on_levels_20_to_500_each_kind_meets_1e_3_or_is_warned_with_its_name_and_figure(kind, seed, tmp_path):
    """Dense, grouped and head weights alike: where FP16 storage moves an output by more than 1e-3 of its
    scale over the whole series, one warning names the stage and gives a figure within 2.5x of that;
    a warning where the series stays within 1e-3 must still tell the truth (within 2.5x). (Seed 4: a
    grouped conv at 1.25e-3 that a check of 128 rows left unwarned.)"""
    x = _levels_20_to_500(8000, seed=seed)
    pipeline, pipe, name = _by_kind(kind, seed, tmp_path)
    y, warned = _run(x, pipeline, chunk=1024)
    actual = _relative_error(y, x, pipe)
    if actual > 1e-3:
        assert len(warned) == 1 and f"{name}: storing its weights as float16" in warned[0], (actual, warned)
    for message in warned:
        assert actual / 2.5 <= _figure(message) <= 2.5 * actual, (actual, message)
    if kind == "head_over_differences":  # level-free inputs: FP16 storage is harmless (2e-4)
        assert actual < 1e-3 and warned == []
    if kind == "depthwise":  # 3e-3 to 5e-3: always warned
        assert warned


@pytest.mark.slow
def test_a_borderline_zero_sum_dense_conv_on_levels_20_to_500_is_warned(tmp_path):
    """The check samples the first chunk (1024 rows here, 8.0e-4 there); over 8000 rows the error is 1.04e-3."""
    x = _levels_20_to_500(8000, seed=1)
    pipeline, pipe, _ = _by_kind("dense_npy", 1, tmp_path)
    y, warned = _run(x, pipeline, chunk=1024)
    assert _relative_error(y, x, pipe) <= 1e-3 or warned


@pytest.mark.parametrize("kind", ["grouped", "depthwise"])
def test_the_warned_figure_is_the_error_on_the_rows_the_check_measured(kind, tmp_path):
    """The check measures the first chunk's first output rows (1024 here); its figure is the engine's error
    there relative to the outputs' scale there. It took the scale from the stored weights, whose sums are off
    the given ones: level x that difference made the scale of a zero-sum conv on levels up to 6x too
    large, and the figure as much too small (1.1e-3 said, 2.3e-3 there, for the depthwise conv)."""
    x = _levels_20_to_500(2000, seed=0)
    pipeline, pipe, _ = _by_kind(kind, 0, tmp_path)
    y, warned = _run(x, pipeline, chunk=1024)
    exact = {"conv": [{**s, "weight_dtype": "float32"} for s in pipe["conv"]]}
    plan = resolve(pipeline_from_dict(exact), [f"f{j}" for j in range(WIDE)])
    rows = slice(plan.halo, plan.halo + 1024)
    ref = pipeline_reference(x, plan)[rows]
    there = float((np.abs(y[rows] - ref).max(axis=0) / np.abs(ref).max(axis=0)).max())
    assert len(warned) == 1, (there, warned)
    assert there / 1.5 <= _figure(warned[0]) <= 1.5 * there, (there, warned[0])


@pytest.mark.parametrize("start", [10, 500, 900])
def test_a_symbol_starting_inside_the_sample_does_not_inflate_the_figure(start: int) -> None:
    """The check re-centred raw levels per block, where the engine centres on the chunk's level first: a
    symbol starting inside a block had no level of that block's own, and its raw price put 1.1e-1 in the
    warning where the engine's outputs moved by 1.0e-3 to 1.2e-3."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 8, 5))
    pipe = {"conv": [{"weights": w - w.mean(axis=2, keepdims=True), "weight_dtype": "float16"}]}
    x = 100 + np.cumsum(rng.normal(scale=0.05, size=(1500, 8)), axis=0)
    x[:start, 3] = np.nan
    y, warned = _run(x, pipe)
    plan = resolve(pipeline_from_dict({"conv": [{**pipe["conv"][0], "weight_dtype": "float32"}]}),
                   [f"f{j}" for j in range(8)])  # fmt: skip
    rows = slice(plan.halo, plan.halo + 1024)
    ref = pipeline_reference(x, plan)[rows]
    there = float(np.nanmax(np.nanmax(np.abs(y[rows] - ref), axis=0) / np.nanmax(np.abs(ref), axis=0)))
    assert len(warned) == 1 and there / 1.5 <= _figure(warned[0]) <= 1.5 * there, (there, warned)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_check_copies_its_sample_asynchronously_and_warns_as_on_the_cpu():
    x = price_series(20000, 4, seed=7)
    w2 = np.random.default_rng(2).normal(size=(3, 8, 3))
    pipe = {"conv": [{"filters": ["ma:16", "ma:8"]}, {"name": "mix", "weights": w2 - w2.mean(axis=(1, 2), keepdims=True)}]}  # fmt: skip
    y_gpu, warned_gpu = _run(x, pipe, device="cuda")
    y_cpu, warned_cpu = _run(x, pipe, device="cpu")
    assert len(warned_gpu) == 1 and "[[conv]] #2 (mix): storing its weights as float16" in warned_gpu[0]
    assert len(warned_cpu) == 1
    np.testing.assert_array_equal(np.isnan(y_gpu), np.isnan(y_cpu))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_checks_pinned_copy_outlives_a_capture_that_its_thread_ends_in():
    """The check's thread ends while the run's thread captures a CUDA graph on the stream that copied the
    sample into pinned memory (the batched engine captures its second step): freeing that block there recorded
    its free event into the capture, and a later pinned allocation failed ("CUDA error: invalid argument")."""
    import threading
    import time

    from tsconv.engine.compute import Backend

    x = torch.from_numpy(price_series(4096, C, seed=3)).cuda()
    plan = resolve(
        pipeline_from_dict({"conv": [{"weights": _zero_sum_dense()}]}), [f"f{j}" for j in range(C)]
    )
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        backend = Backend(plan, torch.device("cuda"), use_triton=True)
        backend.run(
            x, 0, x[0].clone()
        )  # starts the check: an asynchronous copy into pinned memory on `stream`
        graph, y = torch.cuda.CUDAGraph(), torch.empty_like(x)
        graph.capture_begin(capture_error_mode="thread_local")
        deadline = time.monotonic() + 60
        while (
            any(t.name == "tsconv-fp16-check" for t in threading.enumerate()) and time.monotonic() < deadline
        ):
            time.sleep(0.01)
        ended_in_capture = not any(t.name == "tsconv-fp16-check" for t in threading.enumerate())
        y.copy_(x)
        graph.capture_end()
    graph.replay()
    for _ in range(4):  # pinned allocations poll the events of freed blocks
        torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        backend.finish()  # frees the buffers, outside the capture
    torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    assert ended_in_capture
    torch.testing.assert_close(y, x)


@pytest.mark.parametrize("chunk", [1024, 65536])
@pytest.mark.parametrize("first_rows", ["late symbol", "stale quote"])
def test_a_move_the_first_rows_cannot_show_is_still_warned(first_rows, chunk):
    """A stage that mixes in a symbol listed at row 3,000 is NaN over the first rows, and a zero-sum filter
    over a stale opening quote is 0 there: the check, on the first 1,024 rows alone, judged nothing and warned
    of nothing while storage moved the outputs by up to 0.81 of their scale. It samples the rest of a long
    chunk too, and checks outputs it could not judge again on later chunks."""
    x = price_series(12_000, 8, seed=31)
    if first_rows == "late symbol":
        x[:3000, 5] = np.nan
    else:
        x[:3000] = x[3000]
    w = np.random.default_rng(2).standard_normal((8, 8, 5))
    pipe = {
        "conv": [{"filters": ["id"]}, {"weights": (w - w.mean(axis=2, keepdims=True)).astype(np.float32)}]
    }
    y, warned = _run(x, pipe, chunk=chunk)
    assert len(warned) == 1 and "[[conv]] #2" in warned[0], warned
    assert _relative_error(y, x, pipe) > 1e-2


@pytest.mark.parametrize("listed", [5300, 7100])
def test_a_symbol_listed_after_the_last_doubling_check_is_still_warned(listed):
    """Later checks start at least twice as far in (1,024, 2,048, 4,096 at --chunk 1024): a symbol listed at
    row 5,300 of 8,000 was NaN over every row checked, and its outputs, moved by storage past 1e-3 of their
    scale, went unwarned. The last check samples the series' last rows."""
    x = price_series(8000, 8, seed=31)
    x[:listed, 5] = np.nan
    y, warned = _run(x, _late_symbol_pipe(), chunk=1024)
    assert len(warned) == 1 and "[[conv]] #2" in warned[0], warned
    assert _relative_error(y, x, _late_symbol_pipe()) > 1e-3


@pytest.mark.parametrize("rows", [7169, 8000])
def test_the_last_check_is_not_judged_on_a_short_last_chunk(rows):
    """At 7,169 rows the chunk that reaches the end holds one row: the last check judged each output's scale
    from it and warned of 3.9e-3 where storage moved the outputs by 2.5e-4."""
    w = np.random.default_rng(0).normal(size=(16, 8, 3)).astype(np.float32)
    pipe = {"conv": [{"filters": ["diff:1"]}, {"weights": w}]}
    x = price_series(rows, 8, seed=0)
    x[:5300, 5] = np.nan
    y, warned = _run(x, pipe, chunk=1024)
    assert _relative_error(y, x, pipe) < 5e-4 and warned == [], warned


def _late_symbol_pipe() -> dict:
    w = np.random.default_rng(2).standard_normal((8, 8, 5))
    return {
        "conv": [{"filters": ["id"]}, {"weights": (w - w.mean(axis=2, keepdims=True)).astype(np.float32)}]
    }


def test_the_check_samples_only_the_rows_that_hold_data():
    """A batched run computes a short last step at full size: the rows past its data are stale or never
    written. The check sampled them too; a huge value there became the outputs' scale and hid a move of
    storage past 1e-3 of it. ``Backend.valid_rows`` bounds the sample."""
    from tsconv.engine.compute import Backend

    x = price_series(3000, 8, seed=31)
    plan = resolve(pipeline_from_dict(_late_symbol_pipe()), [f"f{j}" for j in range(8)])
    rows = torch.cat([torch.from_numpy(x), torch.full((1096, 8), 1e30)])  # 1,096 rows past the data
    backend = Backend(plan, torch.device("cpu"))
    backend.valid_rows = 3000
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend.run(rows, 0, rows[0].clone())
        backend.finish()
    warned = [str(w.message) for w in caught if issubclass(w.category, TsconvWarning)]
    assert len(warned) == 1 and "[[conv]] #2" in warned[0], warned


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_symbol_listed_after_the_first_step_is_still_judged():
    """The batched engine replays its steps as a CUDA graph, which runs no Python of the stages: only the
    first step was checked, and a symbol listed after it went unjudged, its outputs moved by storage unwarned.
    Replayed steps are checked where the first step's sample could not judge every output."""
    x = price_series(300_000, 8, seed=31)
    x[:150_000, 5] = np.nan  # listed after the first step (at most 65,536 rows)
    pipe = _late_symbol_pipe()
    y, warned = _run(x, pipe, device="cuda")
    assert len(warned) == 1 and "[[conv]] #2" in warned[0], warned
    assert _relative_error(y, x, pipe) > 1e-2


# ------------------------------------------------------------------- a stage whose later stages show its rounding


def _four_levels(rows: int = 4000) -> np.ndarray:
    """Random walks near 20, 137.5, 480 and 63.2 on a 0.01 tick grid, float32."""
    rng = np.random.default_rng(3)
    levels = np.array([20.0, 137.5, 480.0, 63.2])
    return np.round(levels + np.cumsum(rng.normal(0, 1, (rows, 4)) * levels * 0.001, 0), 2).astype(np.float32)


_LWMA = {"name": "lwma", "weights": np.tile(np.arange(1, 6) / 15.0, (4, 1, 1)), "groups": "depthwise"}


@pytest.mark.parametrize(
    "then",
    [{"filters": ["diff:1", "dev:8"]}, {"weights": np.tile([-1.0, 1.0], (4, 1, 1)), "groups": "depthwise"}],
    ids=["bank", "dense"],
)
def test_a_stage_whose_rounding_a_later_stage_shows_is_warned(then):
    """A weighted 5-step mean of prices, FP16-stored, is off by 6e-7 of the price: its own outputs' figure.
    Differenced after it, the pipeline's outputs were 1.5e-3 to 1.9e-3 of their scale off, unwarned."""
    x = _four_levels()
    pipe = {"conv": [_LWMA, then]}
    y, warned = _run(x, pipe, device="cpu")
    actual = _relative_error(y, x, pipe)
    assert actual > 1e-3
    assert len(warned) == 1, (actual, warned)
    assert "[[conv]] #1 (lwma): storing its weights as float16 moves the pipeline's output" in warned[0]
    assert actual / 2.5 <= _figure(warned[0]) <= 2.5 * actual, (actual, warned[0])


@pytest.mark.parametrize(
    "pipe",
    [
        {"conv": [_LWMA, {"filters": ["ma:4", "ma:16"]}]},  # rounded, but the outputs keep the price's scale
        {
            "conv": [
                {**_LWMA, "weights": np.tile([0.25, 0.25, 0.5], (4, 1, 1))},
                {"filters": ["diff:1", "dev:8"]},
            ]
        },
        {"conv": [{"filters": ["ma:5", "ema:6"]}, {"filters": ["diff:1", "dev:8"]}]},  # banks store nothing
    ],
    ids=["rounded_then_means", "exact_then_differences", "banks"],
)
def test_a_chain_that_storage_leaves_within_its_promise_is_not_warned(pipe):
    x = _four_levels()
    y, warned = _run(x, pipe, device="cpu")
    assert warned == [] and _relative_error(y, x, pipe) < 5e-4


def test_the_check_computes_on_torchs_threads_not_the_engines_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # the check's re-centred first-stage convs went through the engine's fixed CPU tiles: its sample of about a
    # thousand rows is two tiles, so a 4096 -> 256 stage ran on two of an H100 host's 16 cores and a GPU run
    # waited 0.6 s more for it (its bits reach no output, only the warning's figure)
    import threading

    from tsconv.engine import compute

    in_check: list[str] = []
    tiles = compute.conv1d_cpu

    def noting(*args, **kwargs):
        in_check.append(threading.current_thread().name)
        return tiles(*args, **kwargs)

    monkeypatch.setattr(compute, "conv1d_cpu", noting)
    x = price_series(4000, C, seed=5)
    _, warned = _run(x, {"conv": [{"weights": _zero_sum_dense()}]}, chunk=1024)
    assert warned, "the check ran and judged the stage"
    assert in_check and "tsconv-fp16-check" not in in_check  # the engine's own convs do use the tiles


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_a_stages_own_figure_is_its_outputs_move_after_its_activation(activation: str) -> None:
    """A stage's own figure compared the move of its output before the activation with the scale after it (the
    activation ran in place on the outputs the figure's scale was read from): a tanh stage over prices, whose
    outputs are 1.0 whatever the rounding, was warned as moved by 2.4e-3 of its scale. The move now goes through
    the activation as the pipeline's outputs' figure does; a relu over a zero-sum stage is still judged."""
    rng = np.random.default_rng(0)
    x = (100 + np.cumsum(rng.normal(0, 0.01, (2000, 1)), axis=0)).astype(np.float32)
    taps = [0.1, 0.2, 0.3] if activation == "tanh" else [0.1, 0.2, -0.3]
    pipe = {
        "conv": [{"weights": np.array([[[1.0]]])}, {"weights": np.array([[taps]]), "activation": activation}]
    }
    y, warned = _run(x, pipe, device="cpu")
    exact = tsconv.features(x, {**pipe, "weight_dtype": "float32"}, device="cpu")
    ok = np.isfinite(exact)
    actual = float(np.abs(y - exact)[ok].max() / np.abs(exact[ok]).max())
    if activation == "tanh":
        assert actual == 0.0 and warned == [], warned  # saturated: storage moves no output
    else:
        assert actual > 1e-3 and len(warned) == 1, (actual, warned)
        assert actual / 2.5 <= _figure(warned[0]) <= 2.5 * actual, (actual, warned[0])


def test_the_warning_names_the_output_that_storage_moves():
    """The warning gave the output's index ("output 4", "the pipeline's output 12"), which the user had to map to
    a column; it names the column (or, for a stage before others, its output as ``<stage>.<o>``)."""
    x = price_series(4000, 4, seed=3)
    w = np.zeros((6, 4, 5), np.float32)
    w[:, :, 0], w[:, :, -1] = -0.5, 0.5  # float16 holds these: storage moves no output but the one below
    w[4] = 3 * _zero_sum_dense(9)[0, :4]
    for pipe, said in (
        ({"conv": [{"name": "s", "weights": w}]}, "moves output 's.4' by up to"),
        ({"conv": [{"name": "s", "weights": w}, {"filters": ["id", "diff:3"]}]},
         "moves the pipeline's output 's.4.id' by up to"),
    ):  # fmt: skip
        _, warned = _run(x, pipe, chunk=1024)
        assert len(warned) == 1 and "[[conv]] #1 (s): storing its weights as float16 " + said in warned[0], (
            warned
        )
    head = np.zeros((4 * C, 3))
    head[:, 2] = np.random.default_rng(1).normal(size=4 * C)
    head[:, 2] -= head[:, 2].mean()  # zero-sum over the means of prices: storage moves output 2 only
    pipe = {"conv": [{"filters": ["ma:16", "ma:4"]}], "head": {"name": "h", "weights": head}}
    _, warned = _run(price_series(4000, 2 * C, seed=5), pipe, chunk=1024)
    assert len(warned) == 1 and "[head]: storing its weights as float16 moves output 'h.2' by up" in warned[0]


@pytest.mark.parametrize("kind", ["demeaning_bias", "saturated_tanh"])
def test_the_heads_figure_is_its_outputs_move_after_its_bias_and_activation(kind: str) -> None:
    """The head's figure (its own, and the scale a stage before it is carried to) was read from ``y @ W``, without
    the head's bias and activation: a head over prices whose bias takes their level off (outputs near 0, not
    100) was off by 7.2e-3 of its outputs' scale, unwarned, and a tanh head saturated at 1.0 over prices, which
    storage moves not at all, was warned as moved by 9.7e-4. Both are judged on the outputs the user gets."""
    rng = np.random.default_rng(5)
    x = (100 + np.cumsum(rng.normal(0, 0.01, (4000, 2)), axis=0)).astype(np.float32)
    if kind == "demeaning_bias":
        w = np.array([[0.3], [0.4]])
        head = {"weights": w, "bias": -(x[:100].mean(axis=0) @ w)}
    else:  # 0.3 x - 0.2 y near 10 over prices near 100: tanh gives 1.0 in float32
        head = {"weights": np.array([[0.3], [-0.2]]), "activation": "tanh"}
    pipe = {"conv": [{"filters": ["id"]}], "head": head}
    y, warned = _run(x, pipe, device="cpu")
    exact = tsconv.features(x, {**pipe, "weight_dtype": "float32"}, device="cpu")
    actual = float(np.abs(y - exact).max() / np.abs(exact).max())
    if kind == "saturated_tanh":
        assert actual == 0.0 and warned == [], warned
    else:
        assert actual > 5e-3 and len(warned) == 1, (actual, warned)
        assert "[head]: storing its weights as float16 moves output 'head.0'" in warned[0]
        assert actual / 2.5 <= _figure(warned[0]) <= 2.5 * actual, (actual, warned[0])


@pytest.mark.parametrize("chunk", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_a_short_chunk_is_judged_on_the_rows_the_check_samples_not_on_its_own_few(chunk: int) -> None:
    # Judged on each chunk alone, the check saw an output's scale in 1 to 3 rows: dense_head on walks near 100
    # was warned of 1.7e-3 (--chunk 1) and 5.3e-4 (--chunk 3), unwarned at the default --chunk (its error
    # there: under 4e-4), and this conv of 6.1e-3 "on 1 rows sampled". Short chunks' rows are now gathered.
    x = price_series(1200, 64, seed=3)
    assert _run(x, "dense_head", chunk=chunk)[1] == [] and _run(x, "dense_head", chunk=1024)[1] == []
    x = price_series(1400, C, seed=3)
    pipe = {"conv": [{"weights": _zero_sum_dense()}]}
    _, warned = _run(x, pipe, chunk=chunk)
    _, whole = _run(x, pipe, chunk=1024)
    assert len(warned) == 1 and len(whole) == 1 and "on 1024 rows sampled" in warned[0], warned
    assert _figure(whole[0]) / 2 <= _figure(warned[0]) <= 2 * _figure(whole[0]), (warned, whole)


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_wide_rows_whose_moves_float32_cannot_hold_are_judged_on_their_moves(dtype) -> None:
    """The CPU reads float64 and wide-integer rows as float64 (a cumulative volume near 1e12 moving by up to
    2,000 a step), but the check rounded its sample to float32 (ulp 131,072 there) before centring it: its
    outputs' scale came from a staircase, 3e-3 of the outputs' scale went unwarned. The check now centres
    such a sample in float64 first, as the engine does, and warns with the figure of what it measured."""
    rows = 20_000
    steps = np.random.default_rng(1).integers(0, 2001, rows)
    x = (10**12 + np.cumsum(steps)).astype(dtype)[:, None]
    pipe = {"conv": [{"weights": np.array([[[0.3, -0.1, -0.2]]])}]}
    y, warned = _run(x, pipe, device="cpu")
    actual = _relative_error(y, x.astype(np.float64), pipe)
    assert actual > 1e-3  # the premise: storage moves these outputs past the promise
    assert len(warned) == 1 and actual / 2 <= _figure(warned[0]) <= 2 * actual, (actual, warned)


@pytest.mark.parametrize("listed", [203, 2100])
def test_a_wide_feature_listed_late_is_judged_on_the_level_the_engine_falls_back_on(listed) -> None:
    """A block of the first stage with no finite sample of a feature (a symbol listed inside it) takes the
    chunk's level in the engine, but the check's outputs' scale took 0 there: a cumulative volume near 1e12
    listed late was rounded raw to float32 (ulp 131,072), the scale came out about 100x too large, and 7.5e-4
    (listed at 203) or 2.5e-3 (at 2,100: past the 1e-3 promised) of the outputs' scale went unwarned."""
    rng = np.random.default_rng(0)
    rows = 4000
    x = 1e12 + np.cumsum(rng.integers(500, 1500, size=(rows, 2)), axis=0).astype(np.float64)
    x[:listed, 1] = np.nan
    pipe = {"conv": [{"weights": np.array([[[0.1, -0.3, 0.2], [0.3, -0.1, -0.2]]])}]}
    y, warned = _run(x, pipe, chunk=1024, device="cpu")
    actual = _relative_error(y, x, pipe)
    assert actual > 5e-4  # the premise: storage moves these outputs past the warning's threshold
    assert len(warned) == 1 and actual / 2 <= _figure(warned[0]) <= 2 * actual, (actual, warned)
