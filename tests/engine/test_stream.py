"""tsconv.Stream: pushed rows get exactly the features of a batch run over everything pushed, at a bounded cost.

On the CPU the equality is bit for bit (NaN where the batch run has NaN), for every built-in pipeline and
dense ones, whatever the push sizes: one row, odd sizes, a whole chunk, several chunks, pushes straddling
chunk edges. The data are realistic: random walks of prices between 20 and 500 on a 0.01 tick grid,
symbols that start late (leading NaN) and gaps (NaN runs mid-series).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tsconv
from tsconv.engine.compute import Backend
from tsconv.pipeline.spec import as_pipeline, resolve

from ..helpers import error_bound

# FP16-storage notes on random weights: the arithmetic is under test here
pytestmark = pytest.mark.filterwarnings("ignore::tsconv.errors.TsconvWarning")

W64 = [f"x{j}" for j in range(64)]
ZS = ["px_a", "qty", "px_b"]
_rng = np.random.default_rng(7)
# a dense first stage of halo 1 (its re-centring blocks read two steps before them) and a grouped one of
# halo 6 under a head
DENSE_K2 = {"conv": [{"weights": _rng.normal(size=(4, 3, 2)) / 3, "bias": _rng.normal(size=4),
                      "weight_dtype": "float32", "activation": "relu"}]}  # fmt: skip
DENSE_GROUPED = {
    "conv": [{"weights": _rng.normal(size=(6, 1, 4)), "groups": 3, "dilation": 2, "weight_dtype": "float16"},
             {"filters": ["ma:4", "diff:1"]}],
    "head": {"weights": _rng.normal(size=(12, 2)), "activation": "tanh"},
}  # fmt: skip
# (pipeline, names or a count of features)
PIPELINES = [
    ("default", 3),
    ("trend_ema", 3),
    ("multiscale", 2),
    ("returns_zscore", ZS),
    ("dense_head", W64),
    (DENSE_K2, 3),
    (DENSE_GROUPED, 3),
]
IDS = ["default", "trend_ema", "multiscale", "returns_zscore", "dense_head", "dense_k2", "dense_grouped"]


def prices(rows: int, features: int, *, seed: int, late: bool = True, gaps: bool = True) -> np.ndarray:
    """Random walks between 20 and 500 on a 0.01 tick grid, float32; with ``late`` feature 0 starts late,
    with ``gaps`` runs of NaN in the middle of the others."""
    rng = np.random.default_rng(seed)
    ticks = np.round(rng.uniform(20, 500, size=features) * 100)
    steps = rng.choice([-2, -1, 0, 0, 0, 1, 2], size=(rows, features))
    x = ((ticks + np.cumsum(steps, axis=0)) / 100).astype(np.float32)
    if late:
        x[: rng.integers(1, max(2, rows // 3)), 0] = np.nan
    if gaps and features > 1:
        for _ in range(3):
            j, a = int(rng.integers(1, features)), int(rng.integers(0, rows))
            x[a : a + int(rng.integers(1, 60)), j] = np.nan
    return x


def _names(names: list[str] | int) -> list[str] | None:
    return None if isinstance(names, int) else names


def _width(names: list[str] | int) -> int:
    return names if isinstance(names, int) else len(names)


def pushed(stream: tsconv.Stream, x: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Push ``x`` in pieces of ``sizes`` (cycled until x is used up); the pushes' results, concatenated."""
    outs, i, k = [], 0, 0
    while i < x.shape[0]:
        n = sizes[k % len(sizes)]
        outs.append(stream.push(x[i : i + n]))
        assert outs[-1].shape == (min(n, x.shape[0] - i), len(stream.output_names))
        i, k = i + n, k + 1
    return np.concatenate(outs)


def _same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == expected.shape
    diff = np.flatnonzero(~((got == expected) | (np.isnan(got) & np.isnan(expected))).all(axis=1))
    assert diff.size == 0, f"{diff.size} rows differ, the first at row {diff[0] if diff.size else None}"


PUSHES = {  # (chunk, push sizes, cycled)
    "one_row": (64, [1]),
    "odd": (64, [7, 1, 13, 3]),
    "one_chunk": (64, [64]),
    "several_chunks": (64, [200, 64, 5]),
    "default_chunk": (65536, [37, 250, 1]),
}
# the default run keeps one case per push pattern; -m slow runs every pipeline with every pattern
FAST = {("default", "one_row"), ("returns_zscore", "odd"), ("dense_k2", "one_chunk"),
        ("dense_head", "several_chunks"), ("dense_grouped", "default_chunk")}  # fmt: skip
GRID = [
    pytest.param(
        pipe, names, *PUSHES[kind], id=f"{kind}-{pid}", marks=() if (pid, kind) in FAST else pytest.mark.slow
    )  # fmt: skip
    for pid, (pipe, names) in zip(IDS, PIPELINES, strict=True)
    for kind in PUSHES
]


@pytest.mark.parametrize(("pipeline", "names", "chunk", "sizes"), GRID)
def test_pushes_equal_a_batch_run_bit_for_bit(pipeline, names, chunk, sizes):
    rows = 400 if sizes == [1] else 700
    x = prices(rows, _width(names), seed=len(sizes) + chunk)
    for warmup in ("nan", "zero"):
        expected = tsconv.features(x, pipeline, names=_names(names), chunk=chunk, warmup=warmup)
        stream = tsconv.Stream(pipeline, features=names, chunk=chunk, warmup=warmup, device="cpu")
        _same(pushed(stream, x, sizes), expected)
        assert stream.rows == rows


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(list(zip(IDS, PIPELINES, strict=True))),
    rows=st.integers(1, 600),
    chunk=st.sampled_from([1, 16, 63, 64, 100, 256, 65536]),
    sizes=st.lists(st.integers(1, 300) | st.sampled_from([1, 2, 63, 64, 65]), min_size=1, max_size=8),
    seed=st.integers(0, 2**20),
    warmup=st.sampled_from(["nan", "zero"]),
)
def test_any_sequence_of_pushes_equals_the_batch_run(case, rows, chunk, sizes, seed, warmup):
    _, (pipeline, names) = case
    x = prices(rows, _width(names), seed=seed)
    stream = tsconv.Stream(pipeline, features=names, chunk=chunk, warmup=warmup, device="cpu")
    got = pushed(stream, x, sizes)
    if (warmup == "nan" and rows <= stream.halo) or rows <= min(stream.plan.nan_rows(warmup), default=0):
        # The batch run refuses a series within the warm-up (with warmup="zero" too, within a [preprocess]'s
        # NaN steps); its rows are those of a longer one (causality).
        longer = np.concatenate([x, prices(stream.halo + 1, x.shape[1], seed=seed + 1, late=False)])
        expected = tsconv.features(longer, pipeline, names=_names(names), chunk=chunk, warmup=warmup)[:rows]
    else:
        expected = tsconv.features(x, pipeline, names=_names(names), chunk=chunk, warmup=warmup)
    _same(got, expected)


def test_a_one_row_push_that_starts_a_block_equals_the_batch_run():
    """Row 16 of a one-row-at-a-time stream starts a re-centring block: its call holds that one row, and the
    head's matmul of a single row must round as the batch run's product of 17 rows does."""
    x = prices(17, 64, seed=0)
    stream = tsconv.Stream("dense_head", features=W64, chunk=63, device="cpu")
    _same(pushed(stream, x, [1]), tsconv.features(x, "dense_head", names=W64, chunk=63))


@pytest.mark.parametrize("groups", [1, 2])
def test_a_one_tap_first_stage_equals_the_batch_run_bit_for_bit(groups):
    """A one-tap stage (a [4 -> 2, K 1] mix of prices, or one output a group) is a product whose rows are its
    output channels in torch's CPU conv: with fewer than four, MKL rounded each re-centring block by how many
    blocks shared the call, and pushes of 37 rows or one differed from the batch run in the last bit (a few
    rows of 700 of mid prices; rarely on a tick grid, whose small moves' products are exact)."""
    rng = np.random.default_rng(5)
    pipe = {
        "weight_dtype": "float32",
        "conv": [{"weights": rng.normal(size=(2, 4 // groups, 1)), "groups": groups}],
    }
    x = (100 + np.cumsum(rng.normal(scale=0.05, size=(700, 4)), axis=0)).astype(np.float32)  # mid prices
    x[:40, 1] = np.nan
    expected = tsconv.features(x, pipe, chunk=512)
    for sizes in ([37], [1]):
        _same(pushed(tsconv.Stream(pipe, features=4, chunk=512, device="cpu"), x, sizes), expected)


def test_a_dense_stage_after_another_matches_within_float32_rounding():
    """torch's CPU conv rounds a stage's outputs by the length of the call: after another stage (here a
    dense one) a stream matches the batch run within the engine's bound, not bit for bit."""
    rng = np.random.default_rng(3)
    pipe = {"conv": [{"weights": rng.normal(size=(6, 3, 3)) / 3, "weight_dtype": "float32"},
                     {"weights": rng.normal(size=(4, 6, 3)) / 4, "weight_dtype": "float32"}]}  # fmt: skip
    x = prices(600, 3, seed=4)
    expected = tsconv.features(x, pipe, chunk=128)
    got = pushed(tsconv.Stream(pipe, features=3, chunk=128, device="cpu"), x, [1, 17, 128, 50])
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    plan = resolve(as_pipeline(pipe), ["f0", "f1", "f2"])
    ok = ~np.isnan(expected)
    assert (np.abs(got - expected)[ok] <= 2 * error_bound(x, plan)[ok]).all()


def test_the_state_is_bounded_and_a_push_computes_its_rows_plus_the_lookback_per_chunk(monkeypatch):
    computed: list[int] = []
    run = Backend.run

    def counting(self, x, *args, **kwargs):
        computed.append(x.shape[0])
        return run(self, x, *args, **kwargs)

    monkeypatch.setattr(Backend, "run", counting)
    stream = tsconv.Stream("default", features=2, chunk=256, device="cpu")
    lookback = stream.lookback
    assert lookback <= stream.halo + 2 * 16
    x = prices(3000, 2, seed=5)
    for i in range(0, 1200, 1):
        stream.push(x[i])
    assert stream.lookback == lookback and stream._rows_kept.shape == (lookback, 2)
    assert max(computed) <= 1 + lookback
    computed.clear()
    stream.push(x[1200:3000])
    # one call per chunk the push falls in (8 here), each its rows plus at most the lookback
    assert len(computed) == 8 and sum(computed) <= 1800 + 8 * lookback
    assert stream.lookback == lookback
    # the default chunk, as the README words it: n + lookback within a chunk, n + 2 x lookback across a
    # chunk boundary (the promise was n + lookback for any push, which a push across the boundary exceeds)
    stream = tsconv.Stream("default", features=2, device="cpu")
    x = prices(65636, 2, seed=5, gaps=False)
    stream.push(x[:65386])
    computed.clear()
    stream.push(x[65386:65486])
    assert len(computed) == 1 and computed[0] <= 100 + lookback
    computed.clear()
    stream.push(x[65486:65586])
    assert len(computed) == 2 and 100 + lookback < sum(computed) <= 100 + 2 * lookback


def test_one_row_pushes_as_1d_rows_and_tensors():
    x = prices(400, 3, seed=6)
    expected = tsconv.features(x, "multiscale")
    stream = tsconv.Stream("multiscale", features=["a", "b", "c"])
    got = np.stack([stream.push(torch.from_numpy(row)).numpy()[0] for row in x])
    _same(got, expected)
    _, names = tsconv.features(x, "multiscale", names=["a", "b", "c"], return_names=True)
    assert stream.output_names == names and stream.output_names[0].startswith("a.")
    assert stream.push(np.empty((0, 3), dtype=np.float32)).shape == (0, len(names))


def test_wrong_rows_are_refused_with_what_was_expected():
    stream = tsconv.Stream("default", features=3)
    with pytest.raises(tsconv.ShapeError, match=r"expects rows \[n, 3\].*got shape \[5, 4\]"):
        stream.push(np.zeros((5, 4)))
    with pytest.raises(tsconv.ShapeError, match=r"got shape \[2, 2, 3\]"):
        stream.push(np.zeros((2, 2, 3)))
    with pytest.raises(tsconv.ShapeError, match="real numbers"):
        stream.push(np.zeros((2, 3), dtype=bool))
    with pytest.raises(tsconv.ShapeError, match="names repeat"):
        tsconv.Stream("default", features=["a", "a"])
    with pytest.raises(tsconv.ShapeError, match="count or an ordered list of names"):
        tsconv.Stream("default", features="abc")
    with pytest.raises(tsconv.TsconvError, match="warmup"):
        tsconv.Stream("default", features=3, warmup="later")
    assert stream.rows == 0  # nothing refused was taken


def test_features_names_must_be_an_ordered_list_as_the_streams_are():
    # a set's order follows the hash seed: its names went to whichever columns it listed first; a string was
    # read as its characters, and [1, "1"] gave two outputs named "1.diff1"
    x = prices(50, 2, seed=7)
    for bad in ({"MSFT", "AAPL"}, {"MSFT": 0, "AAPL": 1}, "ab"):
        with pytest.raises(tsconv.ShapeError, match="names must be an ordered list"):
            tsconv.features(x, "default", names=bad)
        with pytest.raises(tsconv.ShapeError, match="count or an ordered list of names"):
            tsconv.Stream("default", features=bad)
    with pytest.raises(tsconv.ShapeError, match="names repeat .*'1'"):
        tsconv.features(x, "default", names=[1, "1"])
    with pytest.raises(tsconv.ShapeError, match="names repeat .*'1'"):
        tsconv.Stream("default", features=[1, "1"])
    ordered = ("MSFT", "AAPL")
    for listed in (list(ordered), np.array(ordered), pd.Index(ordered)):
        _, names = tsconv.features(x, "default", names=listed, return_names=True)
        assert names[0] == "MSFT.diff1" and all(type(n) is str for n in names)
    _, names = tsconv.features(x, "default", names=[7, 9], return_names=True)
    assert names[0] == "7.diff1"


def test_a_pandas_frames_index_gives_the_pushes_times():
    # the index was dropped: minutes pushed out of order were taken (a diff of -5 across the jump) where
    # features() refuses the concatenation
    pipe = {"conv": [{"filters": ["diff:1"]}]}
    idx = pd.date_range("2024-01-02 09:30", periods=6, freq="min", tz="America/New_York")
    df = pd.DataFrame({"a": np.arange(6, dtype=np.float64) + 100}, index=idx)
    stream = tsconv.Stream(pipe, features=["a"])
    stream.push(df.iloc[3:])
    assert stream.last_time == np.datetime64("2024-01-02T14:35", "ns")
    with pytest.raises(tsconv.TsconvError, match="time must increase strictly"):
        stream.push(df.iloc[:3])
    assert stream.rows == 3
    labels = tsconv.Stream(pipe, features=["a"])  # integers are row labels as often as times: [0] each push
    for i in range(3):
        labels.push(pd.DataFrame({"a": [100.0 + i]}, index=[0]))
    assert labels.last_time is None and labels.rows == 3
    one = tsconv.Stream(pipe, features=["a"])
    one.push(df.reset_index(drop=True))  # the default range index: no times
    one.push(df.iloc[0])  # a Series is one row, its index the names
    assert one.last_time is None and one.rows == 7


def test_a_pushs_index_or_coordinate_of_times_beyond_ns_keeps_its_unit():
    # a DatetimeIndex (or a DataArray's time coordinate) was taken as datetime64[ns], which wraps times past 2262
    # or before 1677 held in s/ms/us: the year 3000 was the last time pushed as 1831, so a later push of 1900 was
    # taken (a series run backwards, silently); features() takes such times in their own unit, and so does push
    import xarray as xr

    pipe = {"conv": [{"filters": ["diff:1"]}]}
    later = pd.date_range("3000-01-01", periods=3, freq="D", unit="s")
    earlier = pd.date_range("1900-01-01", periods=3, freq="D", unit="us")
    x = np.arange(3, dtype=np.float64)[:, None] + 100
    for make in (
        lambda t: pd.DataFrame({"a": x[:, 0]}, index=t),
        lambda t: xr.DataArray(x, dims=("time", "feature"), coords={"time": t.values, "feature": ["a"]}),
    ):
        stream = tsconv.Stream(pipe, features=["a"], device="cpu")
        stream.push(make(later))
        assert str(stream.last_time) == "3000-01-03T00:00:00"  # not wrapped into 1831
        with pytest.raises(tsconv.TsconvError, match="time must increase strictly"):
            stream.push(make(earlier))
        assert stream.rows == 3


def test_a_long_frames_multiindex_push_is_refused_as_several_series():
    # a push indexed by (time, symbol) was taken row by row as one series: a.diff1 differenced one symbol's
    # value against the other's (99, -98, ...), as features() did
    idx = pd.MultiIndex.from_product(
        [pd.date_range("2024-01-02 09:30", periods=3, freq="min", tz="UTC"), ["A", "B"]],
        names=["time", "symbol"],
    )
    long = pd.DataFrame({"a": [1.0, 100.0, 2.0, 200.0, 3.0, 300.0]}, index=idx)
    stream = tsconv.Stream({"conv": [{"filters": ["diff:1"]}]}, features=["a"])
    with pytest.raises(
        tsconv.ShapeError, match="push\\(\\): the frame's index has 2 levels, and its level 'time'"
    ):
        stream.push(long)
    assert stream.rows == 0
    stream.push(long.xs("A", level="symbol", drop_level=False))  # one series' rows are time steps
    assert stream.rows == 3


def test_time_must_increase_strictly_across_pushes():
    stream = tsconv.Stream("default", features=1)
    stream.push(np.ones((3, 1)), time=np.array([1, 2, 3]))
    stream.push(np.ones((1, 1)), time=[5])
    assert stream.last_time == 5 and stream.rows == 4
    with pytest.raises(
        tsconv.TsconvError, match=r"row 0 of this push \(5\) is not after the last time pushed"
    ):
        stream.push(np.ones((2, 1)), time=np.array([5, 6]))
    with pytest.raises(tsconv.TsconvError, match=r"row 2 of this push \(7\) is not after row 1's \(7\)"):
        stream.push(np.ones((3, 1)), time=np.array([6, 7, 7]))
    with pytest.raises(tsconv.ShapeError, match="time must be 2 integer or datetime64 stamps"):
        stream.push(np.ones((2, 1)), time=np.array([8]))
    assert stream.rows == 4 and stream.last_time == 5


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("pipeline", "names"), [PIPELINES[0], PIPELINES[3], PIPELINES[4]], ids=IDS[:1] + IDS[3:5]
)
def test_pushes_on_cuda_match_the_batch_run_within_the_fp32_bound(pipeline, names):
    x = prices(3000, _width(names), seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tsconv.TsconvWarning)
        expected = tsconv.features(x, pipeline, names=_names(names), device="cuda")
        got = pushed(tsconv.Stream(pipeline, features=names, device="cuda"), x, [1, 7, 1024, 333])
    plan = resolve(as_pipeline(pipeline), _names(names) or [f"f{j}" for j in range(_width(names))])
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    ok = ~np.isnan(expected)
    assert (np.abs(got - expected)[ok] <= 2 * error_bound(x, plan)[ok]).all()


@pytest.mark.parametrize("sizes", [[5], [1], [37, 300, 1, 64]])
def test_a_zscore_of_float64_levels_keeps_the_level_of_its_chunk(sizes):
    """float64 rows' z-scores sum deviations from a level per chunk (the median of its first full window): a
    push computing part of a chunk must use the chunk's, not one from its own rows, also where the window is
    found in a later push (a symbol that starts late, a gap longer than the halo) and with a huge print in it.
    With a drift, the sums' cancellation shows a wrong level."""
    rng = np.random.default_rng(0)
    x = np.round(np.cumsum(rng.choice([-1, 0, 1], size=(3000, 3)) + 0.3, axis=0) + 2000) / 100  # 20 -> 29
    x[:700, 1] = np.nan
    x[1500:1900, 2] = np.nan
    x[1024 - 40, 0] = 1e12
    x[1900 + 3, 2] = -1e12
    pipe = {"preprocess": {"zscore": 32}, "conv": [{"filters": ["id", "ma:4"]}]}
    _same(pushed(tsconv.Stream(pipe, features=3), x, sizes), tsconv.features(x, pipe))


def test_a_gelu_stage_equals_the_batch_run_bit_for_bit():
    """torch's CPU gelu gave a value other bits in its vectorised loop than in its scalar loop, so pushes of 7
    rows (857 of 16,000 values) differed from the batch run's chunks."""
    rng = np.random.default_rng(0)
    x = 100 + np.cumsum(rng.standard_normal((2000, 6)) * 0.05, axis=0)
    w = rng.standard_normal((8, 6, 5)).astype(np.float32) * 0.2
    pipeline = {
        "weight_dtype": "float32",
        "conv": [{"weights": w - w.mean(axis=2, keepdims=True), "activation": "gelu"}],
    }
    expected = tsconv.features(x, pipeline, chunk=512, device="cpu")
    _same(pushed(tsconv.Stream(pipeline, features=6, chunk=512, device="cpu"), x, [7]), expected)


@pytest.mark.parametrize("warmup", ["nan", "zero"])
def test_a_push_stopped_part_way_takes_nothing(warmup):
    """An interrupt in a push's third chunk left the fill state and the rows kept advanced while ``rows``
    said nothing was taken: pushing on gave 4,231 other values (a late symbol filled from a row not taken)."""
    x = prices(3000, 4, seed=3)
    expected = tsconv.features(x, "default", chunk=256, warmup=warmup)
    stream = tsconv.Stream("default", features=4, chunk=256, warmup=warmup, device="cpu")
    first = stream.push(x[:100])
    run, calls = stream._backend.run, []

    def interrupted(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return run(*args, **kw)

    stream._backend.run = interrupted
    with pytest.raises(KeyboardInterrupt):
        stream.push(x[100:2000], time=np.arange(100, 2000))
    assert stream.rows == 100 and stream.last_time is None
    stream._backend.run = run
    _same(np.concatenate([first, stream.push(x[100:2000]), stream.push(x[2000:])]), expected)


def test_a_push_refused_by_a_warning_made_an_error_warns_again_when_pushed_again() -> None:
    """A push that a warning made an error (warnings.simplefilter("error")) took nothing of its rows, but the
    check that warned counted itself done: the same rows pushed again were taken without the warning (the
    wide-integer check, and the FP16-storage check, read on a frame before the push began too)."""
    import warnings

    import polars as pl

    rng = np.random.default_rng(1)
    head = rng.normal(size=(32, 3))
    zero_sum_head = {"conv": [{"filters": ["ma:16", "ma:4"]}], "head": {"weights": head - head.mean(axis=0)}}
    x = prices(2000, 16, seed=5, late=False, gaps=False)
    wide = (np.arange(40).reshape(20, 2) + 2**60).astype(np.int64)
    cases = [
        (zero_sum_head, 16, lambda: x),
        ("default", 2, lambda: wide),
        ("default", ["a", "b"], lambda: pl.DataFrame({"a": wide[:, 0], "b": wide[:, 1]})),
    ]
    for pipe, features, rows in cases:
        stream = tsconv.Stream(pipe, features=features, device="cpu")
        for _ in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("error", tsconv.TsconvWarning)
                with pytest.raises(tsconv.TsconvWarning):
                    stream.push(rows())
            assert stream.rows == 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stream.push(rows())
        assert len([w for w in caught if issubclass(w.category, tsconv.TsconvWarning)]) == 1


def test_a_time_of_nat_is_refused():
    stream = tsconv.Stream("default", features=1)
    t = np.array(["2026-01-02T09:30:05", "NaT", "2026-01-02T09:30:01"], dtype="datetime64[ns]")
    with pytest.raises(tsconv.TsconvError, match=r"row 1 of this push has no time \(NaT\)"):
        stream.push(np.ones((3, 1)), time=t)
    assert stream.rows == 0 and stream.last_time is None


def test_the_fp16_check_samples_a_push_of_enough_rows_not_a_single_row() -> None:
    """One-row pushes had the FP16-storage check judge an output's scale from one row: a warning of 6e-3
    where features() on the same rows, and the whole series, stayed under 5e-4. A push too short to sample is
    not checked; a long push is checked as features() checks the series."""
    import warnings

    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3, 5)) * 0.3
    pipe = {"conv": [{"weights": w - w.mean(axis=2, keepdims=True), "weight_dtype": "float16"}]}
    r = np.random.default_rng(2)
    x = (
        np.round(r.uniform(20, 500, 3) * 100) + np.cumsum(r.choice([-2, -1, 0, 0, 0, 1, 2], (3000, 3)), 0)
    ) / 10

    def warned(run) -> list[str]:  # noqa: ANN001
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        return [str(m.message) for m in caught if issubclass(m.category, tsconv.TsconvWarning)]

    assert warned(lambda: tsconv.features(x, pipe, chunk=256)) == []
    one_by_one = tsconv.Stream(pipe, features=3, chunk=256, device="cpu")
    assert warned(lambda: [one_by_one.push(row) for row in x]) == []
    x[:2000] = np.nan  # symbols listed later: features() warns, and so does a stream pushed in one go
    expected = warned(lambda: tsconv.features(x, pipe))
    assert len(expected) == 1
    whole = tsconv.Stream(pipe, features=3, device="cpu")
    assert warned(lambda: whole.push(x)) == expected


@pytest.mark.parametrize("pre", [None, {"transform": "log"}])
@pytest.mark.parametrize("size", [1, 37])
def test_short_pushes_are_checked_for_fp16_storage_on_the_rows_they_gather(pre, size: int) -> None:
    """Pushes each shorter than the FP16-storage check's sample went unchecked: a zero-sum dense conv moved by
    1.2e-3 of its scale (features() warns) was never warned of when rows came one at a time."""
    import warnings

    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 8, 5))
    pipe = {"conv": [{"weights": w - w.mean(axis=2, keepdims=True), "weight_dtype": "float16"}]}
    if pre is not None:
        pipe["preprocess"] = pre
    x = 100 + np.cumsum(rng.normal(scale=0.05, size=(1500, 8)), axis=0)

    def warned(run) -> list[str]:  # noqa: ANN001
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        return [str(m.message) for m in caught if "float16" in str(m.message)]

    expected = warned(lambda: tsconv.features(x, pipe))
    assert len(expected) == 1
    stream = tsconv.Stream(pipe, features=8, device="cpu")
    got = warned(lambda: [stream.push(x[i : i + size]) for i in range(0, x.shape[0], size)])
    # the same stage warned of (the output it names is the worst of the rows each sampled)
    assert [m.split(" moves output")[0] for m in got] == [expected[0].split(" moves output")[0]]


def test_a_short_push_refused_by_the_warning_its_gathered_rows_raised_warns_again() -> None:
    """The push whose rows complete the FP16-storage check's gathered sample, refused by the warning made an
    error, must leave the rows gathered before it: pushed again, it completes the same sample and warns again
    (judged on its own 37 rows, it would not be checked at all)."""
    import warnings

    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 8, 5))
    pipe = {"conv": [{"weights": w - w.mean(axis=2, keepdims=True), "weight_dtype": "float16"}]}
    x = 100 + np.cumsum(rng.normal(scale=0.05, size=(1500, 8)), axis=0)
    stream = tsconv.Stream(pipe, features=8, device="cpu")
    refused = None
    for i in range(0, x.shape[0], 37):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", tsconv.TsconvWarning)
                stream.push(x[i : i + 37])
        except tsconv.TsconvWarning:
            refused = i
            break
    assert refused is not None and stream.rows == refused
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error", tsconv.TsconvWarning)
            with pytest.raises(tsconv.TsconvWarning, match="float16"):
                stream.push(x[refused : refused + 37])
        assert stream.rows == refused
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream.push(x[refused : refused + 37])
    assert len([w for w in caught if "float16" in str(w.message)]) == 1


def test_a_dataarray_is_read_by_its_coordinates_as_features_reads_it() -> None:
    """A DataArray was read by position: columns went to the wrong features, and a (feature, time) one with
    as many times as features was silently transposed, its time coordinate dropped."""
    import xarray as xr

    a, b = _ab()
    want = tsconv.features(np.c_[a, b], "default", names=["a", "b"], device="cpu")
    t = np.datetime64("2024-01-01", "ns") + np.arange(300) * np.timedelta64(1, "s")
    da = xr.DataArray(np.c_[b, a], dims=("time", "feature"), coords={"time": t, "feature": ["b", "a"]})
    stream = tsconv.Stream("default", features=["a", "b"], device="cpu")
    got = np.concatenate([stream.push(da[:2].transpose("feature", "time")),  # as many times as features
                          stream.push(da[2:150].transpose("feature", "time")),
                          stream.push(da.isel(time=150)),  # one row, its scalar time coordinate
                          stream.push(da[151:])])  # fmt: skip
    assert np.array_equal(got, want, equal_nan=True)
    assert stream.last_time == t[-1] and stream.rows == 300
    with pytest.raises(tsconv.TsconvError, match="time must increase strictly"):
        stream.push(da[:1])
    with pytest.raises(tsconv.ShapeError, match="read by its 'feature' coordinate, which has 'b', 'c'"):
        stream.push(da[:1].assign_coords(feature=["b", "c"]))
    assert stream.rows == 300


def test_a_bfloat16_tensor_is_pushed_as_features_takes_it() -> None:
    # .numpy() cannot convert bfloat16, and the failure was worded as a shape error
    x = torch.linspace(100, 101, 600).reshape(200, 3).to(torch.bfloat16)
    stream = tsconv.Stream("default", features=3, device="cpu")
    got = stream.push(x)
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got.nan_to_num(-1), tsconv.features(x, "default", device="cpu").nan_to_num(-1))


def test_a_pandas_series_of_one_feature_over_time_is_told_to_be_a_frame() -> None:
    df = pd.DataFrame({"a": [1.0, 2.0]}, index=pd.date_range("2024-01-01", periods=2))
    stream = tsconv.Stream("default", features=["a"], device="cpu")
    with pytest.raises(tsconv.ShapeError, match="a pandas Series is taken as one row, its index naming") as e:
        stream.push(df["a"])
    assert "series.to_frame()" in e.value.hint
    assert stream.push(df["a"].to_frame()).shape[0] == 2


def test_rows_of_iterrows_with_every_feature_missing_beside_a_datetime_are_missing_values() -> None:
    # iterrows() gives such a row as datetime64, its NaNs as NaT: push refused it as "not numeric: a (Datetime)"
    x = prices(60, 2, seed=3)
    x[20:23] = np.nan  # a halt: no feature has a value
    t = pd.date_range("2026-01-02 09:30", periods=60, freq="s")
    df = pd.DataFrame({"time": t, "a": x[:, 0], "b": x[:, 1]})
    assert df.iloc[21:22].iterrows().__next__()[1].dtype.kind == "M"
    stream = tsconv.Stream("default", features=["a", "b"], device="cpu")
    got = np.concatenate([stream.push(row) for _, row in df.iterrows()])
    _same(got, tsconv.features(x, "default", names=["a", "b"], device="cpu"))
    assert stream.last_time == t[-1].to_datetime64()
    with pytest.raises(tsconv.ShapeError, match=r"not numeric: a \(Datetime"):  # a datetime that is one
        stream.push(pd.Series([t[-1] + pd.Timedelta(1, "s")] * 3, index=["time", "a", "b"]))


def test_a_time_column_without_times_is_refused_with_hints_push_can_follow() -> None:
    # the hints named features()'s time_column=None, which push() does not take, and told to rename a duration
    # column, which push() then refused as no feature; a row of iterrows() has its integer times as floats
    import polars as pl

    df = pd.DataFrame({"time": np.arange(5) * 10, "a": np.linspace(100, 101, 5), "b": np.linspace(50, 49, 5)})
    stream = tsconv.Stream("default", features=["a", "b"], device="cpu")
    row = next(df.iterrows())[1]
    with pytest.raises(tsconv.ShapeError, match=r"'time' column is not a time \(Float64\)") as err:
        stream.push(row)
    assert "df.iloc[[i]]" in err.value.hint and "time_column" not in err.value.hint
    floats = df.astype({"time": "float64"})
    durations = pl.DataFrame(
        {"time": pl.Series([1, 2], dtype=pl.Duration("ms")), "a": [1.0, 2], "b": [1.0, 2]}
    )
    for frame, what in ((floats, "not a time"), (durations, "a duration")):
        with pytest.raises(tsconv.ShapeError, match=f"'time' column is {what}") as err:
            stream.push(frame)
        assert "time_column" not in err.value.hint and "drop it" in err.value.hint
    assert stream.rows == 0
    for i in range(5):  # the routes the hints give
        stream.push(df.iloc[[i]])
    stream.push(floats.drop(columns="time").iloc[:2], time=[60, 70])
    assert stream.rows == 7 and stream.last_time == 70


def _ab(rows: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return 100 + rng.normal(size=rows).cumsum(), 50 + rng.normal(size=rows).cumsum()


@pytest.mark.parametrize("kind", ["pandas", "polars", "pyarrow"])
def test_a_frame_is_read_by_its_column_names_not_their_order(kind: str) -> None:
    """A frame's columns were read by position: (MSFT, AAPL) pushed into a stream of (AAPL, MSFT) gave each
    symbol the other's features, silently, and a 'time' column became a feature's values."""
    import pandas as pd
    import polars as pl
    import pyarrow as pa

    a, b = _ab()
    want = tsconv.features(np.c_[a, b], "default", names=["AAPL", "MSFT"], device="cpu")
    t = np.datetime64("2026-01-02T09:30", "ns") + np.arange(300) * np.timedelta64(1, "s")
    make = {"pandas": pd.DataFrame, "polars": pl.DataFrame, "pyarrow": pa.table}[kind]
    stream = tsconv.Stream("default", features=["AAPL", "MSFT"], device="cpu")
    got = np.concatenate([stream.push(make({"MSFT": b[:100], "AAPL": a[:100]})),
                          stream.push(make({"time": t[100:], "MSFT": b[100:], "AAPL": a[100:]}))])  # fmt: skip
    assert np.array_equal(got, want, equal_nan=True)
    assert stream.last_time == t[-1]
    with pytest.raises(tsconv.TsconvError, match="the frame's columns 'IBM' are not features"):
        stream.push(make({"AAPL": a[:1], "MSFT": b[:1], "IBM": a[:1]}))
    with pytest.raises(tsconv.TsconvError, match="has no column 'MSFT'"):
        stream.push(make({"AAPL": a[:1]}))
    with pytest.raises(tsconv.TsconvError, match="time= was given too"):
        stream.push(make({"time": t[:1], "AAPL": a[:1], "MSFT": b[:1]}), time=t[:1])
    assert stream.rows == 300  # the refused pushes took nothing


def test_times_of_another_unit_or_integer_width_are_compared_as_the_first_pushs() -> None:
    x = np.ones((2, 2), np.float32)
    stream = tsconv.Stream("default", features=2, device="cpu")
    stream.push(x, time=np.array(["2026-01-02T09:30", "2026-01-02T09:31"], dtype="datetime64[ns]"))
    stream.push(x, time=np.array(["2026-01-02T09:32", "2026-01-02T09:33"], dtype="datetime64[s]"))
    assert stream.last_time == np.datetime64("2026-01-02T09:33", "ns")
    with pytest.raises(tsconv.TsconvError, match="time must increase strictly"):
        stream.push(x, time=np.array(["2026-01-02T09:33", "2026-01-02T09:34"], dtype="datetime64[us]"))
    with pytest.raises(tsconv.TsconvError, match="all datetime64 or all integers"):
        stream.push(x, time=np.array([10**18, 2 * 10**18]))
    coarse = tsconv.Stream("default", features=2, device="cpu")
    coarse.push(x, time=np.array(["2026-01-02T09:30", "2026-01-02T09:31"], dtype="datetime64[s]"))
    with pytest.raises(tsconv.TsconvError, match="finer than the datetime64"):
        coarse.push(
            x, time=np.datetime64("2026-01-02T09:32", "ms") + np.array([1, 2]).astype("timedelta64[ms]")
        )
    ints = tsconv.Stream("default", features=2, device="cpu")
    ints.push(x, time=np.array([1, 2]))
    ints.push(x, time=np.array([3, 4], dtype=np.int32))
    assert ints.last_time == 4


def test_features_may_be_any_sequence_of_names_or_a_numpy_count() -> None:
    import pandas as pd

    assert tsconv.Stream("default", features=np.int64(2)).input_names == ("f0", "f1")
    for names in (pd.Index(["AAPL", "MSFT"]), np.array(["AAPL", "MSFT"])):
        assert tsconv.Stream("default", features=names).input_names == ("AAPL", "MSFT")


def test_an_empty_float64_push_reads_later_rows_as_float64_as_the_concatenation_is() -> None:
    # the concatenation is float64, which features() reads as float64 on the CPU; an empty float64 push left
    # the stream reading float32, 200 rows off the batch run's by float32's last bits
    rng = np.random.default_rng(0)
    pipe = {"conv": [{"weights": rng.normal(size=(2, 3, 4)), "weight_dtype": "float32"}]}
    x = (100 + rng.choice([-1, 0, 1], size=(400, 3)).cumsum(0) / 100).astype(np.float32)
    x[200:] = x[200:] * np.float32(1000.37) + np.float32(0.123)  # a jump far from the chunk's level
    pushes = [x[:200], np.empty((0, 3)), x[200:]]
    stream = tsconv.Stream(pipe, features=3, device="cpu")
    got = np.concatenate([stream.push(p) for p in pushes])
    assert np.array_equal(got, tsconv.features(np.concatenate(pushes), pipe, device="cpu"), equal_nan=True)


def test_the_chunk_hint_names_the_callers_default() -> None:
    with pytest.raises(tsconv.TsconvError) as err:
        tsconv.features(np.ones((10, 1)), chunk=0)
    assert err.value.hint == "the default is 65536."
    with pytest.raises(tsconv.TsconvError) as err:
        tsconv.process("in.zarr", "out.zarr", chunk=0)
    assert err.value.hint == "the default is 1024."


def test_a_numpy_integer_chunk_is_taken_as_the_int(tmp_path: Path) -> None:
    # chunk=np.int64(100) (a chunk size computed with numpy) was refused as 'chunk must be a positive integer,
    # got np.int64(100)'; it is that integer, and an output records it as JSON
    import zarr

    from ..helpers import price_series, write_store

    x = price_series(600, 2, seed=3)
    want = tsconv.features(x, "default", chunk=100, device="cpu")
    assert np.array_equal(
        tsconv.features(x, "default", chunk=np.int64(100), device="cpu"), want, equal_nan=True
    )
    stream = tsconv.Stream("default", features=2, chunk=np.int32(100), device="cpu")
    assert stream.chunk == 100 and type(stream.chunk) is int
    assert np.array_equal(np.concatenate([stream.push(x[:250]), stream.push(x[250:])]), want, equal_nan=True)
    src = write_store(tmp_path / "in.zarr", x)
    tsconv.process(src, tmp_path / "out.zarr", chunk=np.int64(100), device="cpu")
    assert zarr.open_group(str(tmp_path / "out.zarr"), mode="r").attrs["tsconv"]["chunk"] == 100
    with pytest.raises(tsconv.TsconvError, match="chunk must be a positive integer, got np.int64\\(0\\)"):
        tsconv.features(x, chunk=np.int64(0))
    with pytest.raises(tsconv.TsconvError, match="chunk must be a positive integer"):
        tsconv.features(x, chunk=np.bool_(True))


def test_features_in_no_order_are_refused_and_a_pandas_row_is_read_by_its_names() -> None:
    import pandas as pd
    import polars as pl

    # a set's order changes from process to process: the rows' columns would get other names
    with pytest.raises(tsconv.TsconvError, match="ordered list of names, got set"):
        tsconv.Stream("default", features={"AAPL", "MSFT"})
    assert tsconv.Stream("default", features=np.array(2)).input_names == ("f0", "f1")
    a, b = _ab(100)
    frame = pd.DataFrame({"MSFT": b, "AAPL": a})
    want = tsconv.features(np.c_[a, b], "default", names=["AAPL", "MSFT"], device="cpu")
    stream = tsconv.Stream("default", features=["AAPL", "MSFT"], device="cpu")
    got = np.concatenate([stream.push(frame.iloc[i]) for i in range(100)])  # Series rows, as iterrows gives
    assert np.array_equal(got, want, equal_nan=True)
    with pytest.raises(tsconv.TsconvError, match="column names repeat: AAPL"):
        stream.push(pd.DataFrame([[1.0, 2.0, 3.0]], columns=["AAPL", "MSFT", "AAPL"]))
    durations = pl.DataFrame(
        {"time": pl.Series([1, 2], dtype=pl.Duration("ms")), "AAPL": [1.0, 2], "MSFT": [1.0, 2]}
    )
    with pytest.raises(tsconv.TsconvError, match="'time' column is a duration"):
        stream.push(durations)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a LazyFrame's schema is not resolved before it is collected
        stream.push(pl.LazyFrame({"AAPL": [1.0], "MSFT": [2.0]}))
    assert stream.rows == 101


def test_a_time_beyond_the_first_pushs_unit_is_refused_as_such() -> None:
    x = np.ones((1, 2), np.float32)
    stream = tsconv.Stream("default", features=2, device="cpu")
    stream.push(x, time=np.array(["2026-01-02"], dtype="datetime64[ns]"))
    with pytest.raises(tsconv.TsconvError, match=r"beyond the span datetime64\[ns\] holds"):
        stream.push(x, time=np.array(["2300-01-01"], dtype="datetime64[us]"))


def test_pushes_just_short_of_a_check_judge_a_late_symbol_as_features_does() -> None:
    # pushes of 127 rows were each sampled alone (about 140 rows), the later checks' doubling passed the
    # symbol's start before it had moved enough: features() warned, the stream did not
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, 8, 5))
    pipe = {"conv": [{"weights": w - w.mean(axis=2, keepdims=True), "weight_dtype": "float16"}]}
    for _ in range(4):  # the fourth series this generator draws: one whose late symbol the stream missed
        x = 100 + np.cumsum(rng.normal(scale=0.05, size=(12000, 8)), axis=0)
    x[:9000, 3] = np.nan

    def warned(run) -> bool:  # noqa: ANN001
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        return any("float16" in str(m.message) for m in caught)

    assert warned(lambda: tsconv.features(x, pipe, chunk=4096, device="cpu"))
    stream = tsconv.Stream(pipe, features=8, chunk=4096, device="cpu")
    assert warned(lambda: [stream.push(x[i : i + 127]) for i in range(0, 12000, 127)])


@pytest.mark.parametrize("head_shape", [(100, 16), (100, 1)], ids=["100x16", "one_output"])
def test_a_heads_rows_do_not_depend_on_the_push(head_shape: tuple[int, int]) -> None:
    """A bank of 100 outputs into a head: torch's CPU matmul rounded a product of fewer than four rows, and any
    one-column product, by the row count and position (MKL's other kernels); pushes of 1, 2 and 3 rows
    differed from the batch run."""
    rng = np.random.default_rng(11)
    pipe = {"conv": [{"filters": ["id", "diff:1", "ma:4", "dev:8"]}],
            "head": {"weights": rng.normal(size=head_shape) / 10, "weight_dtype": "float32"}}  # fmt: skip
    x = prices(400, 25, seed=12)
    expected = tsconv.features(x, pipe, chunk=64)
    _same(pushed(tsconv.Stream(pipe, features=25, chunk=64, device="cpu"), x, [1, 2, 3, 5, 70]), expected)


def test_masked_entries_are_missing_values_in_features_and_push() -> None:
    """A numpy masked array's masked cells are missing (NaN), as the mask says, not the values beneath it:
    ``np.asarray`` keeps the data and drops the mask."""
    rng = np.random.default_rng(3)
    x = (100 + np.cumsum(rng.integers(-2, 3, size=(400, 3)), axis=0) * 0.01).astype(np.float32)
    hidden = np.zeros(x.shape, bool)
    hidden[50:60, 1] = True
    hidden[200, :] = True
    masked = np.ma.array(np.where(hidden, np.float32(9999.0), x), mask=hidden)
    want = tsconv.features(np.where(hidden, np.nan, x).astype(np.float32), device="cpu")
    np.testing.assert_array_equal(tsconv.features(masked, device="cpu"), want)
    s = tsconv.Stream("default", features=3, device="cpu")
    got = np.concatenate([s.push(masked[i : i + 37]) for i in range(0, 400, 37)])
    np.testing.assert_array_equal(got, want)
    ints = np.ma.array(np.arange(40, dtype=np.int32).reshape(20, 2), mask=np.zeros((20, 2), bool))
    ints[5, 0] = np.ma.masked
    y = tsconv.features(
        ints, pipeline={"conv": [{"filters": ["id"]}], "preprocess": {"fill": "none"}}, device="cpu"
    )
    assert np.isnan(y[5, 0]) and y[6, 0] == 12 and y[5, 1] == 11
